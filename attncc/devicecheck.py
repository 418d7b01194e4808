"""Value checks that run on the device (DESIGN.md §3a): a call never reads a value back to
the host; what it finds wrong (a value it then did not use) is OR-ed into a flag word on the
device, and `k.check()` reads the word, raises the first problem as a ValueError naming the
argument, and clears it. With ATTNCC_CHECK=1 every call checks synchronously instead, before
it runs; on CPU tensors nothing needs a sync, so the checks raise at once."""
from __future__ import annotations

import os

import torch

from . import abi

# bit -> (argument, what was wrong; abi.h's ATTNCC_FLAG_*); the lowest set bit is reported first
PROBLEMS = {
    abi.FLAG_SLOT: ("slots", "write_cache got a slot outside [0, num_pages * page size) that is not -1; "
                 "that token was not written"),
    abi.FLAG_PAGE: ("block_table", "a page number outside [0, num_pages) where the sequence has "
                                   "tokens; those tokens were left out of the attention"),
    abi.FLAG_SEQLEN: ("seqlens", "a length below 0 or past what the block table's row holds "
                                 "(max_pages * page size); it was clamped into that range"),
    abi.FLAG_INDEX: ("indices", "an index outside [-1, num_pages * page size); that token was "
                                "left out of the attention"),
    abi.FLAG_SCHEDULE: ("metadata", "a schedule made by k.plan(seqlens) for other lengths or shapes than "
                                    "the call's (the lengths changed after the plan: make it again each "
                                    "step); the call cut its own, so its results are right but the "
                                    "plan's time was lost"),
}


def synchronous() -> bool:
    """ATTNCC_CHECK=1: check every call's values before it runs (one host sync a call)."""
    return os.environ.get("ATTNCC_CHECK", "") not in ("", "0")


class DeviceFlags:
    """One int32 flag word per device."""

    def __init__(self):
        self._words: dict[torch.device, torch.Tensor] = {}

    def word(self, device: torch.device) -> torch.Tensor:
        """The device's flag word, which kernels OR their bits into (made zero on first use;
        first used inside a CUDA graph's capture, each replay zeroes it again)."""
        word = self._words.get(device)
        if word is None:
            word = self._words[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return word

    def record(self, bad: torch.Tensor, bit: int) -> None:
        """OR `bit` into the device's word where the 0-dim bool `bad` is true (no sync)."""
        self.word(bad.device).bitwise_or_(bad.to(torch.int32) * bit)

    def check(self) -> None:
        """Raise the first problem recorded since the last check (reads the words: a sync)."""
        found = 0
        for word in self._words.values():
            found |= int(word.item())
            word.zero_()
        for bit, (argument, what) in sorted(PROBLEMS.items()):
            if found & bit:
                raise ValueError(f"{argument}: {what}")
