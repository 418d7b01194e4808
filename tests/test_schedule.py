"""The balanced split-KV schedule of templates/include/attncc/core/schedule.cuh, run on the host.

tests/cpp/schedule_walk.cu compiles the header's arithmetic (the code the decode and combine
kernels run) into a host program; these tests feed it ragged batches and check what the
kernels rely on: every tile of every sequence is covered by exactly one piece, the parts are
equal to a tile, a sequence inside one part is written directly and only then, only a part's
first and last pieces are partial (the 2 P slots rely on it), the partial slots the decode
writes are the ones the combine reads, in the same order, and no two pieces share a slot.
tests/cpp/combine_shape.cu does the same for core/combine.cuh's CombineShape::part_tasks: what a
part-mode combine warp merges (a slab, a pair of slabs, a row) and a block's rows, so that the
grid fits in one wave where it can."""
import random
import subprocess
from pathlib import Path

import pytest

import attncc.build
from attncc import split

from support import combine_slabs

ROOT = Path(__file__).resolve().parents[1]


def _nvcc():
    try:
        return attncc.build.nvcc()
    except Exception:  # noqa: BLE001 - any failure to find the toolkit means skip
        return None


pytestmark = pytest.mark.skipif(_nvcc() is None, reason="nvcc not found (CUDA toolkit needed)")


def _host_program(tmp_path_factory, name: str) -> Path:
    """tests/cpp/NAME.cu built for the host against the templates' headers."""
    exe = tmp_path_factory.mktemp(name) / name
    subprocess.run([str(_nvcc()), "-std=c++17", "-O1", "-I", str(ROOT / "templates" / "include"),
                    str(ROOT / "tests" / "cpp" / f"{name}.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    exe = _host_program(tmp_path_factory, "schedule_walk")

    def run(cases):
        # a case: (parts, tiles), (parts, tiles, slack): whole_parts_fit's slack in tiles, or
        # (parts, tiles, slack, cost): a piece's cost on the line
        text = "".join(f"{c[0]}{''.join(f':{x}' for x in c[2:])} {' '.join(map(str, c[1]))}\n" for c in cases)
        out = subprocess.run([str(exe)], input=text, check=True, capture_output=True, text=True).stdout
        results, pieces, combine, mode = [], [], {}, None
        for line in out.splitlines():
            tag, *rest = line.split()
            if tag == "Q":  # equal sequences: the closed form must agree with the walk's decision
                assert rest[0] == mode, f"equal_whole_parts says {rest[0]}, the scan {mode}: {line}"
            elif tag == "M":
                mode = rest[0]
                assert rest[1] == "1" or mode == "cut", f"whole parts where whole_parts_possible says none: {line}"
            elif tag == "W":
                pieces.append(tuple(map(int, rest)))
            elif tag == "C":
                combine[int(rest[0])] = None if rest[1:] == ["-"] else [int(x) for x in rest[1:]]
            else:
                results.append((pieces, combine, mode == "whole"))
                pieces, combine, mode = [], {}, None
        return results

    return run


def _check(parts, tiles, pieces, combine, whole, slack=-1, cost=0):
    line = split.line_lengths(tiles, cost)  # each sequence's length on the line: its tiles and a piece's cost
    starts = [sum(line[:s]) for s in range(len(line))]
    total = sum(line)
    label = f"parts={parts} slack={slack} cost={cost} tiles={tiles}"
    bounds, expect_whole = split.whole_parts(tiles, parts, slack, cost)  # the host's statement of the rule
    assert whole == expect_whole, f"{label}: whole-sequence parts {whole}, the model says {expect_whole}"
    if whole:
        _check_whole(parts, tiles, pieces, combine, bounds, label, slack, line)
        return
    by_seq = {s: [] for s in range(len(tiles))}
    by_part = {p: [] for p in range(parts)}
    for part, seq, lo, hi, slot in pieces:
        by_seq[seq].append((part, lo, hi, slot))
        by_part[part].append(slot)
        # the parts cut the line into equal lengths (to a tile), and a piece is the part's stretch of
        # the sequence's tiles, which follow its piece's cost on the line
        begin, end = part * total // parts, (part + 1) * total // parts
        first = starts[seq] + (cost if tiles[seq] else 0)
        if tiles[seq]:
            assert (lo, hi) == (max(first, begin) - first, min(first + tiles[seq], end) - first), \
                f"{label}: part {part} [{begin}, {end}) seq {seq} at {first}: [{lo}, {hi})"
    # only a part's first and last pieces are partial (slots 2 p and 2 p + 1)
    assert all(s == -1 for slots in by_part.values() for s in slots[1:-1]), label
    written = []
    for seq, n in enumerate(tiles):
        got = by_seq[seq]
        assert got, f"{label}: sequence {seq} has no piece"
        # the pieces tile [0, n) in order, once, each non-empty (zero tiles: one empty piece)
        assert got[0][1] == 0 and got[-1][2] == n, f"{label}: seq {seq} {got}"
        assert all(a[2] == b[1] for a, b in zip(got, got[1:])), f"{label}: seq {seq} {got}"
        assert all(hi > lo for _, lo, hi, _ in got) or (n == 0 and len(got) == 1), f"{label}: {got}"
        assert [p for p, *_ in got] == sorted({p for p, *_ in got}), f"{label}: seq {seq} {got}"
        slots = [slot for *_, slot in got]
        if len(got) == 1:
            assert slots == [-1] and combine[seq] is None, f"{label}: seq {seq} {got} {combine[seq]}"
        else:
            assert -1 not in slots, f"{label}: a piece of split seq {seq} written directly"
            assert combine[seq] == slots, f"{label}: seq {seq} decode {slots} combine {combine[seq]}"
            written += slots
    assert len(written) == len(set(written)), f"{label}: partial slots reused: {sorted(written)}"
    assert all(0 <= s < 2 * parts for s in written), label


def _check_whole(parts, tiles, pieces, combine, bounds, label, slack, line):
    """Whole-sequence parts: each sequence one piece, written directly, in part order; the
    parts as the model cuts them (on the line: tiles and pieces' costs), none longer than 17/16
    of the even length nor, with a slack, more than slack over it."""
    assert sorted(seq for _, seq, *_ in pieces) == list(range(len(tiles))), f"{label}: {pieces}"
    assert all(lo == 0 and hi == tiles[seq] and slot == -1 for _, seq, lo, hi, slot in pieces), f"{label}: {pieces}"
    assert [p for p, *_ in pieces] == sorted(p for p, *_ in pieces), f"{label}: parts out of order"
    assert all(slots is None for slots in combine.values()), f"{label}: {combine}"
    part_line = [0] * parts
    for part, seq, *_ in pieces:
        part_line[part] += line[seq]
    assert part_line == [b - a for a, b in zip(bounds, bounds[1:])], f"{label}: {part_line} {bounds}"
    assert max(part_line) * parts * 16 <= sum(line) * 17, label
    assert slack < 0 or max(part_line) * parts <= sum(line) + slack * parts, label


def test_fixed_cases(walk):
    cases = [
        (1, [5]), (3, [5]), (4, [1, 1]), (8, [0, 0, 3]), (2, [0]), (3, []), (5, [0, 0]),
        (33, [128] * 128),                 # MLA h_q 128, b = 128, s_k = 8192, tile_n 64
        (4, [3, 0, 0, 9, 0]), (7, [0, 2, 0]), (2, [4, 0, 4]), (3, [1, 0, 0, 0, 2]),
        (16, [1000, 1, 1, 1]),             # one long sequence among short ones
    ]
    for (parts, tiles), (pieces, combine, whole) in zip(cases, walk(cases)):
        _check(parts, tiles, pieces, combine, whole)


def test_a_piece_costs_its_part_tiles(walk):
    """With a piece's cost c on the line (core/schedule.cuh line_length), a part that holds a
    sequence's start holds c fewer of its tiles: MLA b = 8 s_k 32768 on 66 parts, the 8 parts that
    start a sequence hold 57-58 tiles against 62-63; a cut in a sequence's cost leaves that part no
    piece of it (3 parts of [10, 10] at c 5: part 1 ends where the second sequence's tiles begin)."""
    cases = [(66, [512] * 8, -1, 5), (3, [10, 10], -1, 5), (4, [0, 7, 0, 1, 300], -1, 5), (5, [1] * 9, -1, 40),
             (66, [128] * 128, 16, 5), (33, [512] * 128, 16, 5)]
    results = walk(cases)
    for (parts, tiles, slack, cost), (pieces, combine, whole) in zip(cases, results):
        _check(parts, tiles, pieces, combine, whole, slack, cost)
    pieces, _, whole = results[0]
    assert not whole
    starts = {p for p, _, lo, _, _ in pieces if lo == 0}  # the parts that hold a sequence's start
    held = {p: sum(hi - lo for q, _, lo, hi, _ in pieces if q == p) for p in range(66)}
    assert len(starts) == 8 and {held[p] for p in starts} <= {57, 58}, held
    assert {held[p] for p in range(66) if p not in starts} <= {62, 63}, held
    pieces, _, _ = results[1]
    assert [(p, seq, lo, hi) for p, seq, lo, hi, _ in pieces] == [(0, 0, 0, 5), (1, 0, 5, 10), (2, 1, 0, 10)]
    assert results[4][2] and not results[5][2]  # whole parts at 15.5 over T / P, not at 62


def test_random_ragged_batches(walk):
    rng = random.Random(7)
    cases = []
    for _ in range(400):
        parts = rng.choice([1, 2, 3, 5, 8, 16, 33, 66, 132])
        kind = rng.random()
        size = rng.randrange(0, 60)
        if kind < 0.3:
            tiles = [rng.choice([0, 0, 1, 2, 3]) for _ in range(size)]        # fewer tiles than parts
        elif kind < 0.6:
            tiles = [rng.randrange(0, 300) for _ in range(size)]
        elif kind < 0.8:
            tiles = [rng.choice([0, 1, rng.randrange(2, 2000)]) for _ in range(size)]
        else:
            tiles = [rng.randrange(0, 300)] * rng.choice([size, parts, parts - 1, 2 * parts - 2])  # uniform
        cases.append((parts, tiles, rng.choice([-1, -1, 0, 1, 4, 16, 100]), rng.choice([0, 0, 1, 5, 40])))
    for (parts, tiles, slack, cost), (pieces, combine, whole) in zip(cases, walk(cases)):
        _check(parts, tiles, pieces, combine, whole, slack, cost)


def test_whole_sequence_parts(walk):
    """Even batches run on parts of whole sequences (schedule.cuh): b = 128 on 66 parts (parts
    of one and two sequences, 3 % over the even length), 32 on 33, 64 on 33 with empty
    sequences among them; not where the longest part would exceed 17/16 of the even length:
    31 on 33 (6.5 %), 16 on 33, one long sequence among short ones."""
    zeros_among = [0, 0] + [i % 2 * 9 for i in range(128)] + [0]
    cases = [((66, [128] * 128), True), ((33, [97] * 32), True), ((33, zeros_among), True),
             ((66, [40] * 256), True), ((33, [97] * 31), False), ((33, [97] * 16), False),
             ((16, [1000] + [1] * 40), False), ((132, [7] * 132), True), ((66, [128] * 127 + [129]), True)]
    for ((parts, tiles), expect), (pieces, combine, whole) in zip(cases, walk([c for c, _ in cases])):
        assert whole == expect, f"parts={parts} b={len(tiles)}: whole {whole}"
        _check(parts, tiles, pieces, combine, whole)


def test_whole_parts_with_a_slack_in_tiles(walk):
    """A compute-bound launch (work.cuh whole_slack_tiles) also bounds the longest whole part to
    slack tiles over T / P: MLA b = 128 at s_q 2 (33 parts) takes whole parts at s_k 8192 (128
    tiles a sequence, 15.5 over) with a slack of 16 and not at 32768 (512, 62 over); at s_q 1 (66
    parts, no slack) 32768 stays whole (31 over); a slack of 0 takes only exact parts."""
    cases = [((33, [128] * 128, 16), True), ((33, [512] * 128, 16), False), ((33, [512] * 128, -1), True),
             ((66, [512] * 128, -1), True), ((66, [512] * 128, 16), False), ((66, [40] * 132, 0), True),
             ((33, [128] * 128, 0), False), ((33, [32] * 256, 16), True)]
    for ((parts, tiles, slack), expect), (pieces, combine, whole) in zip(cases, walk([c for c, _ in cases])):
        assert whole == expect, f"parts={parts} b={len(tiles)} slack={slack}: whole {whole}"
        _check(parts, tiles, pieces, combine, whole, slack)


def test_the_check_catches_a_broken_walk(walk):
    """The invariants are not vacuous: a dropped piece or a swapped slot fails them."""
    (pieces, combine, whole), = walk([(3, [5, 4, 4])])
    assert not whole
    _check(3, [5, 4, 4], pieces, combine, whole)
    with pytest.raises(AssertionError):
        _check(3, [5, 4, 4], pieces[1:], combine, whole)
    split = next(s for s, slots in combine.items() if slots)
    with pytest.raises(AssertionError):
        _check(3, [5, 4, 4], pieces, {**combine, split: combine[split][::-1]}, whole)
    with pytest.raises(AssertionError):  # the mode, or a piece moved to the next part
        _check(3, [5, 4, 4], pieces, combine, not whole)
    (pieces, combine, whole), = walk([(4, [3] * 8)])
    assert whole
    _check(4, [3] * 8, pieces, combine, whole)
    moved = [(p + (i == 1), *rest) for i, (p, *rest) in enumerate(pieces)]
    with pytest.raises(AssertionError):
        _check(4, [3] * 8, moved, combine, whole)


@pytest.fixture(scope="module")
def combine_shape(tmp_path_factory):
    exe = _host_program(tmp_path_factory, "combine_shape")

    def run(cases):  # (d_v, num_seqs, seq_rows, wave) -> (task, rows, blocks)
        text = "".join(" ".join(map(str, c)) + "\n" for c in cases)
        out = subprocess.run([str(exe)], input=text, check=True, capture_output=True, text=True).stdout
        return [(task, int(rows), int(blocks)) for task, rows, blocks in (line.split() for line in out.splitlines())]

    return run


def test_the_combine_fits_its_blocks_in_one_wave(combine_shape):
    """MLA h_q 128 s_q 1 on 66 parts (132 decode CTAs, 3 combine blocks an SM: a wave of 396): b = 1
    and b = 4 merge a slab a warp (64 and 256 blocks), b = 8 a pair of slabs (512 blocks of slabs
    would take two waves: 256 of pairs), b = 32 a row, 16 a block (512 blocks of 8 rows would not
    fit), b = 128 the same (the blocks are many). A value of two slabs (GLA's 256) or an odd number
    has no pairs: GLA-2 s_q 2 b = 8 (256 rows a sequence) a row, 8 a block; a 384-wide value at b = 8
    the same; a 128-wide one a slab (its whole row), 8 a block."""
    cases = [(512, 1, 128, 396), (512, 4, 128, 396), (512, 8, 128, 396), (512, 32, 128, 396), (512, 128, 128, 396),
             (256, 8, 256, 396), (256, 32, 256, 396), (384, 8, 128, 396), (128, 8, 64, 396)]
    assert combine_shape(cases) == [("slab", 2, 64), ("slab", 2, 256), ("pair", 4, 256), ("row", 16, 256),
                                    ("row", 16, 1024), ("row", 8, 256), ("row", 16, 512), ("row", 8, 128),
                                    ("slab", 8, 64)]


def test_the_combine_takes_the_narrowest_task_that_fits(combine_shape):
    """Over a grid of shapes: where 16-row blocks are many (>= 512), a row, 16 a block; else a slab
    a warp where its blocks fit in the wave, else a pair (a row of an even number of slabs, four or
    more) where they fit, else a row, 8 a block where they fit, else 16; the blocks are the
    sequences times their rows' blocks."""
    cases = [(d_v, seqs, rows, wave) for d_v in (128, 256, 384, 512) for seqs in (1, 2, 3, 8, 17, 64, 200)
             for rows in (16, 64, 100, 128, 256, 1024) for wave in (24, 132, 264, 396, 1000)]
    for (d_v, seqs, rows, wave), got in zip(cases, combine_shape(cases)):
        slabs, pairs = combine_slabs(d_v)
        blocks = lambda r: seqs * -(-rows // r)  # noqa: E731
        slab_rows = max(8 // slabs, 1)  # a block's 8 warps a slab each
        if blocks(16) >= 512:
            want = ("row", 16)
        elif blocks(slab_rows) <= wave:
            want = ("slab", slab_rows)
        elif pairs and blocks(2 * slab_rows) <= wave:
            want = ("pair", 2 * slab_rows)
        else:
            want = ("row", 8 if blocks(8) <= wave else 16)
        assert got == (*want, blocks(want[1])), (d_v, seqs, rows, wave, got)
