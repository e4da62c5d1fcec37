#!/usr/bin/env python3
"""token_order.py — the order in which frugal's token loader (src/data/tokens.h)
takes its windows, computed in Python, so a PyTorch run can feed the same
batches: fr_rng (src/core/rng.c, splitmix64 chains) and the Fisher-Yates
shuffle of loader.c, for (seed, epoch, count).

    window_order(seed, epoch, count)      -> [w0, w1, ...]   window indices
    batches(seed, epoch, count, B, shuffle=True)
                                          -> [[w, ...], ...] count // B batches of B
    Window w of a part [begin, end) starts at token begin + w*T:
    x = tokens[s:s+T], y = tokens[s+1:s+T+1].

Command line: token_order.py SEED EPOCH COUNT [B]  prints the window order
(one batch a line when B is given).
"""
import sys

M64 = (1 << 64) - 1


def mix(z):
    """splitmix64's finaliser, as rng.c's mix()."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_u64(seed, stream, index):
    """fr_rng_u64(seed, stream, index)."""
    return mix(mix(mix(seed & M64) ^ (stream & M64)) ^ (index & M64))


class Rng:
    """fr_rng: a counter over fr_rng_u64."""

    def __init__(self, seed, stream):
        self.seed, self.stream, self.i = seed, stream, 0

    def next(self):
        v = rng_u64(self.seed, self.stream, self.i)
        self.i += 1
        return v

    def below(self, n):
        """fr_rng_below: uniform in [0, n), rejecting the biased tail."""
        if n <= 1:
            return 0
        lim = M64 - M64 % n
        while True:
            x = self.next()
            if x < lim:
                return x % n


def window_order(seed, epoch, count):
    """The permutation of epoch `epoch`: r = fr_rng_make(seed, 1000 + epoch),
    for i = count-1 down to 1: j = below(i + 1); swap(perm[i], perm[j])."""
    perm = list(range(count))
    r = Rng(seed, 1000 + epoch)
    for i in range(count - 1, 0, -1):
        j = r.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def batches(seed, epoch, count, B, shuffle=True):
    """The batches of an epoch (drop_last): batch b holds order[b*B:(b+1)*B]."""
    order = window_order(seed, epoch, count) if shuffle else list(range(count))
    return [order[b * B:(b + 1) * B] for b in range(count // B)]


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    seed, epoch, count = int(argv[1]), int(argv[2]), int(argv[3])
    if len(argv) == 5:
        for b in batches(seed, epoch, count, int(argv[4])):
            print(" ".join(map(str, b)))
    else:
        print(" ".join(map(str, window_order(seed, epoch, count))))


if __name__ == "__main__":
    main(sys.argv)
