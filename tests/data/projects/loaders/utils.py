"""Helpers the loop calls: a progress wrapper (as tqdm) and the batch move."""


class Progress:
    def __init__(self, iterable, every=20):
        self.iterable, self.every = iterable, every

    def __iter__(self):
        for n, item in enumerate(self.iterable):
            if n % self.every == 0:
                print(f"[{n}]")
            yield item


def to_device(batch, device):
    return [t.to(device) for t in batch]  # pinned batches, copied without non_blocking
