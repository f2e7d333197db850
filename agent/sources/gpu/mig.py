"""MIG: with MIG on, each instance is a GPU of its own (index ``1000 * (parent + 1) +
slot``, a ``MIG-`` uuid, its parent, profile, instance ids and share of the parent's SMs);
the parent keeps power, clocks and errors."""

from __future__ import annotations

from typing import Any

from .device import Gpu
from .fields import AT, KIND
from .nvml import text

MIG_INDEX_BASE = 1000  # a MIG instance's index: 1000 * (parent index + 1) + its slot


def instances(src: Any, g: Gpu) -> list[Gpu]:
    """The MIG instances of ``g`` (none where MIG is off or not supported)."""
    mode = src.ask("nvmlDeviceGetMigMode", g.handle)
    if not mode or int(mode[0]) != 1:
        return []
    count = src.ask("nvmlDeviceGetMaxMigDeviceCount", g.handle) or 0
    pattr = src.ask("nvmlDeviceGetAttributes_v2", g.handle)
    parent_sms = getattr(pattr, "multiprocessorCount", 0) or 0
    out = []
    for slot in range(min(int(count), 64)):
        mh = src.ask("nvmlDeviceGetMigDeviceHandleByIndex", g.handle, slot)
        if mh is None:
            continue  # an empty slot (NOT_FOUND)
        uuid, name = src.ask("nvmlDeviceGetUUID", mh), src.ask("nvmlDeviceGetName", mh)
        if uuid is None:
            continue
        name = text(name) if name is not None else g.name
        attr = src.ask("nvmlDeviceGetAttributes_v2", mh)
        profile = name.split(" MIG ", 1)[1] if " MIG " in name else ""
        if not profile and attr is not None:
            profile = f"{attr.gpuInstanceSliceCount}g.{round(attr.memorySizeMB / 1024)}gb"
        mig: dict[str, Any] = {"parent_index": g.index}
        if profile:
            mig["mig_profile"] = profile
        for key, fn in (("gpu_instance_id", "nvmlDeviceGetGpuInstanceId"),
                        ("compute_instance_id", "nvmlDeviceGetComputeInstanceId")):
            v = src.ask(fn, mh)
            if v is not None:
                mig[key] = int(v)
        if attr is not None and parent_sms:
            mig["mig_slice_ratio"] = min(1.0, attr.multiprocessorCount / parent_sms)
        out.append(Gpu(MIG_INDEX_BASE * (g.index + 1) + slot, mh, text(uuid), name, parent=g, mig=mig))
    return out


def identity_text(mig: dict[str, Any]) -> list[tuple[int, str]]:
    """Each MIG identity field's place in the row and its text (made once per instance)."""
    from cmdare.wire.rowform import row_field

    return [(AT[k], row_field(KIND[k], v)) for k, v in mig.items()]
