"""A model's state in one buffer: its tensors laid out as consecutive views of one storage, so
that packing, averaging and unpacking it are one operation each, not one per tensor.

Why: every protocol moves and averages the whole model, and a model is many tensors (a
ResNet-18 has 102): tensor by tensor, the training thread's time goes mostly to per-tensor
dispatch (docs/design.md, "The model in one buffer", has the measurements). Gradient buckets
in torch's DDP (`gradient_as_bucket_view`) and flat parameters in FSDP do the same for the
same reason.

`lay_out` moves the tensors' values into one new buffer and points each tensor at its slice
(`tensor.data = view`): the `Parameter` objects, and so the optimizer's references and
state, stay the same; a later `load_state_dict` copies into the views and keeps the layout.
`span` finds the buffer again, from the tensors alone, every time it is asked: where anything
moved a tensor since (`model.to(...)`, a `.data` assignment) it answers None, and the links
go tensor by tensor as before. The arithmetic over the span is the reference's, the one over a
flat copy (`Link.flat`, then the operation, then `Link.unpack_into`): over the same range of
elements it is bit for bit the same in every dtype (bf16 included, which torch's multi-tensor
ops round otherwise).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["lay_out", "pieces", "span", "views"]


@dataclass(frozen=True, slots=True)
class _Seen:
    """What `span` found for a list of tensors, and where they were then: it only checks them
    again while they stay there."""

    addresses: list[int]
    sizes: list[int]
    owner: weakref.ref[torch.Tensor] | None
    """A span's first non-empty tensor (None: no span). Alive and unmoved, it keeps the
    storage, so no other allocation can take those addresses."""
    offset: int = 0
    numel: int = 0


_SEEN: dict[tuple[int, int], _Seen] = {}
_KEPT = 16  # a handful of lists per model (its tensors, parameters, buffers, gradients)
_KEEPING = threading.Lock()  # the training thread and a protocol's threads both look


def span(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The 1-D tensor the `tensors` are consecutive slices of, in order, or None if they are
    not (they are then separate tensors, or not all of one dtype and storage). Empty tensors
    hold no memory: anywhere will do for them.

    Seen once, the tensors are only checked again for their addresses and sizes (several
    times cheaper than looking at each again), as every call must: a tensor moved since
    (`.data` assigned, `model.to`) has another address. A span found is reused
    only while its first tensor lives and every tensor is where it was; a miss kept can only
    send a call down the per-tensor path, which is always right."""
    if not tensors:
        return None
    addresses = [t.data_ptr() for t in tensors]
    sizes = [t.numel() for t in tensors]
    key = (id(tensors[0]), len(tensors))
    seen = _SEEN.get(key)
    if seen is not None and seen.addresses == addresses and seen.sizes == sizes:
        if seen.owner is None:
            return None
        if (owner := seen.owner()) is not None:
            with torch.no_grad():
                return owner.new_empty(0).set_(owner.untyped_storage(), seen.offset,
                                               (seen.numel,))
    whole = _find(tensors, addresses, sizes)
    if whole is None:
        seen = _Seen(addresses, sizes, None)
    else:
        owner = next(t for t, n in zip(tensors, sizes, strict=True) if n)
        seen = _Seen(addresses, sizes, weakref.ref(owner), whole.storage_offset(),
                     whole.numel())
    with _KEEPING:
        if key not in _SEEN and len(_SEEN) >= _KEPT:
            del _SEEN[next(iter(_SEEN))]  # the oldest
        _SEEN[key] = seen
    return whole


def _find(tensors: Sequence[torch.Tensor], addresses: list[int], sizes: list[int]
          ) -> torch.Tensor | None:
    """`span`, checked tensor by tensor."""
    filled = [(t, a, n) for t, a, n in zip(tensors, addresses, sizes, strict=True) if n]
    if not filled or filled[0][0].layout is not torch.strided:
        return None
    first, dtype, size = filled[0][0], filled[0][0].dtype, filled[0][0].element_size()
    if any(t.dtype is not dtype for t in tensors):
        return None
    at = filled[0][1]
    for t, address, n in filled:
        if address != at or not t.is_contiguous():
            return None
        at += n * size
    # Consecutive addresses, and the first and last in one storage: every tensor lies in that
    # live storage's memory (no other live allocation overlaps it), so the span is theirs.
    storage = first.untyped_storage()
    if filled[-1][0].untyped_storage().data_ptr() != storage.data_ptr():
        return None
    with torch.no_grad():
        return first.new_empty(0).set_(storage, first.storage_offset(),
                                       ((at - filled[0][1]) // size,))


def lay_out(tensors: Sequence[torch.Tensor]) -> bool:
    """Lay `tensors` out as consecutive views of one new buffer, values kept; return whether
    they are laid out so (already, or now). Left as they are where they differ in dtype or
    device, are not plainly contiguous (a channels-last weight keeps its format), or share
    memory with each other (tied storage would come apart)."""
    if not tensors or span(tensors) is not None:
        return bool(tensors)
    first = tensors[0]
    if any(t.layout is not torch.strided or not t.is_contiguous() or t.dtype != first.dtype
           or t.device != first.device for t in tensors):
        return False
    filled = [t for t in tensors if t.numel()]
    if len({t.untyped_storage().data_ptr() for t in filled}) < len(filled):
        return False
    buffer = torch.empty(sum(t.numel() for t in tensors), dtype=first.dtype, device=first.device)
    with torch.no_grad():
        pieces = buffer.split([t.numel() for t in tensors])
        for t, piece in zip(tensors, pieces, strict=True):
            piece.copy_(t.reshape(-1))
            t.data = piece.view_as(t)
    return True


def pieces(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Consecutive 1-D slices of `flat`, one per tensor: views, made in one call rather
    than a Python slice per tensor."""
    sizes = [t.numel() for t in tensors]
    return flat[: sum(sizes)].split(sizes)


def views(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive slices of `flat`, shaped as `tensors`."""
    return [piece.view_as(t) for piece, t in zip(pieces(flat, tensors), tensors, strict=True)]
