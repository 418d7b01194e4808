"""A model of the Hopper family's stage protocol in the stacked schedule's split mode
(templates/include/attncc/hopper/stacked.cuh), run over random interleavings.

PTX's mbarrier.try_wait.parity(P) returns once the barrier's current phase has the other
parity: it cannot tell phase n from phase n + 2. In split mode the two consumer warp groups take
alternate tiles of the stream, tile k in stage k % stages, so with an odd number of stages a
stage's consecutive tiles belong to different groups and a group skips every other phase of that
stage's FULL barrier. The model shows the race this made (a group reading a stage whose tile is
still landing: GLA-2 s_q 1 on the device, session 35) and that the kernel's rule, a group first
waits for the release of the stage's previous tile (EMPTY, the phase the producer waited for
before filling its tile), removes it without a deadlock. Only the protocol is modelled: the
kernel's own test is tests/test_gpu.py::test_the_stacked_split_mode_is_deterministic_over_long_sequences."""
import random

import pytest


class Barrier:
    """An mbarrier: `count` arrivals complete the current phase."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the phase expects"
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):  # try_wait.parity
        return self.phase % 2 != parity


def run(stages, tiles, wait_release, seed):
    """One random interleaving of a producer and two split-mode consumer groups over `tiles`
    tiles. Returns 'ok', 'race' (a group read a stage that did not hold its tile, or the producer
    refilled a stage being read) or 'deadlock'."""
    rnd = random.Random(seed)
    full = [Barrier(1) for _ in range(stages)]
    empty = [Barrier(2) for _ in range(stages)]  # EMPTY early: both groups, or the reading one twice
    data = [None] * stages      # the tile whose bytes a stage holds (None: landing)
    reading = [None] * stages
    landing = []                # (stage, tile) issued, not landed (landings complete in any order)
    prod = {"k": 0, "phases": 0}
    groups = [{"k": 0, "phases": 0, "step": "next", "g": g} for g in range(2)]

    class Race(Exception):
        pass

    def land(i):  # the i-th copy in flight lands: its bytes, then its FULL arrival
        s, k = landing.pop(i)
        data[s] = k
        full[s].arrive()
        return True

    def producer_step():
        k = prod["k"]
        s = k % stages
        parity = (prod["phases"] >> s) & 1
        if not empty[s].passed(parity ^ 1):
            return False
        if reading[s] is not None:
            raise Race
        data[s] = None
        landing.append((s, k))
        prod["phases"] ^= 1 << s
        prod["k"] += 1
        return True

    def group_step(st):
        k = st["k"]
        s = k % stages
        parity = (st["phases"] >> s) & 1
        if st["step"] == "next":
            if k % 2 != st["g"]:  # the other group's tile: pass it by
                st["phases"] ^= 1 << s
                st["k"] += 1
                return True
            st["step"] = "release?" if wait_release else "full?"
            return True
        if st["step"] == "release?":
            if not empty[s].passed(parity ^ 1):
                return False
            st["step"] = "full?"
            return True
        if st["step"] == "full?":
            if not full[s].passed(parity):
                return False
            if data[s] != k:
                raise Race
            reading[s] = k
            st["step"] = "done?"
            return True
        # "done?": products over, the stage released
        if data[s] != k:
            raise Race
        reading[s] = None
        empty[s].arrive(2)
        st["phases"] ^= 1 << s
        st["k"] += 1
        st["step"] = "next"
        return True

    try:
        while prod["k"] < tiles or landing or any(g["k"] < tiles for g in groups):
            moves = []
            if prod["k"] < tiles:
                moves.append(producer_step)
            for i in range(len(landing)):
                moves.append(lambda i=i: land(i))
            for g in groups:
                if g["k"] < tiles:
                    moves.append(lambda g=g: group_step(g))

            rnd.shuffle(moves)
            if not any(m() for m in moves):  # the first enabled move of a random order
                return "deadlock"
    except Race:
        return "race"
    return "ok"


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_release_wait_leaves_no_race_and_no_deadlock(stages):
    results = {run(stages, 40, True, seed) for seed in range(300)}
    assert results == {"ok"}


def test_without_it_an_odd_number_of_stages_races():
    assert "race" in {run(3, 40, False, seed) for seed in range(300)}


@pytest.mark.parametrize("stages", [2, 4])
def test_an_even_number_of_stages_never_needed_it(stages):
    assert {run(stages, 40, False, seed) for seed in range(300)} == {"ok"}
