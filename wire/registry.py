"""The event type registry of wire format v1: one entry per event type, with its data
fields (kind and unit), the table the collector stores it in, whether it is high-volume
(the collector parses it in its one-pass JSON struct) and whether the agent sends it in
the row form.  Everything else in the wire package, the agent's sources, the collector's
SQL and the published JSON Schema read their field lists from here.

Adding a field: append it to its type's ``fields`` (never reorder: the row form and the
column blocks are positional), add the column in a collector migration, document it in
docs/wire-format.md.  Adding a type: one ``EventType`` in ``TYPES`` below and a migration
for its table (docs/extending.md, "An event type": the tests that hold each to it).

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .kinds import BOOL, FLOAT, FLOATS, INT, LIST_KINDS, OBJS, STR, STRS

__all__ = ["BOOL", "FLOAT", "FLOATS", "INT", "LIST_KINDS", "OBJS", "STR", "STRS"]  # and the registry below

VERSION = 1
ROLES = ("worker", "ps", "chief", "data", "client")


@dataclass(frozen=True)
class EventType:
    """One event type of the wire format."""

    name: str
    table: str  # the collector's table for it
    fields: dict[str, tuple[str, str]]  # field -> (kind, unit / description), in row-form order
    hot: bool = False  # high-volume: the collector's JSON pass reads its fields in one struct
    row_form: bool = False  # the agent sends it as a row line (``sample_format = "rows"``)

    @property
    def repeated(self) -> tuple[str, ...]:
        """The fields that hold a list (one value per core, NIC, process...)."""
        return tuple(n for n, (k, _) in self.fields.items() if k in LIST_KINDS)


# Every event type, declared once: its name, its table, whether it is high-volume (``hot``)
# and sent as a row line (``row_form``), and its data fields {field: (kind, unit /
# description)}.  Every data field is optional (a source omits what the hardware cannot
# report); a present field must have the declared kind.
TYPES: dict[str, EventType] = {t.name: t for t in (
    EventType("host", "host_samples", hot=True, row_form=True, fields={
        "cpu_util_ratio": (FLOAT, "CPU busy share over the interval, all cores, 0..1"),
        "cpu_per_core_ratio": (FLOATS, "CPU busy share per logical core, 0..1"),
        "load1": (FLOAT, "1-minute load average"),
        "load5": (FLOAT, "5-minute load average"),
        "load15": (FLOAT, "15-minute load average"),
        "mem_total_bytes": (INT, "physical memory"),
        "mem_used_bytes": (INT, "memory in use (total - available)"),
        "mem_available_bytes": (INT, "memory available to new work"),
        "swap_total_bytes": (INT, "swap size"),
        "swap_used_bytes": (INT, "swap in use"),
        "net": (OBJS, "per NIC: nic, rx/tx _bytes_total, _packets_total, _errors_total, _drops_total (counters)"),
        "disk": (OBJS, "per disk: disk, read/write _bytes_total, _ops_total, busy_seconds_total (counters)"),
        "procs": (INT, "number of processes"),
    }),
    EventType("gpu", "gpu_samples", hot=True, row_form=True, fields={
        "index": (INT, "NVML device index"),
        "uuid": (STR, "GPU UUID"),
        "name": (STR, "product name"),
        "util_gpu_ratio": (FLOAT, "share of time a kernel was running, 0..1"),
        "util_mem_ratio": (FLOAT, "share of time device memory was read or written, 0..1"),
        "mem_used_bytes": (INT, "device memory used"),
        "mem_total_bytes": (INT, "device memory total"),
        "power_watts": (FLOAT, "power draw"),
        "power_limit_watts": (FLOAT, "enforced power limit"),
        "temp_celsius": (FLOAT, "GPU core temperature"),
        "sm_clock_hz": (FLOAT, "SM clock"),
        "mem_clock_hz": (FLOAT, "memory clock"),
        "pcie_tx_bytes_per_second": (FLOAT, "PCIe transmit throughput"),
        "pcie_rx_bytes_per_second": (FLOAT, "PCIe receive throughput"),
        "throttle_mask": (INT, "NVML clocks-event (throttle) reason bit mask"),
        "throttle_reasons": (STRS, "names of the active throttle reasons"),
        "ecc_corrected_total": (INT, "volatile corrected ECC errors since driver load (counter)"),
        "ecc_uncorrected_total": (INT, "volatile uncorrected ECC errors since driver load (counter)"),
        "processes": (OBJS, "per process: pid, used_bytes, sm_ratio and mem_ratio (share of the GPU's SMs / memory interface the process used over the interval, where NVML samples it)"),
        # from here on: issue 38 (appended: the row form is positional)
        "gr_engine_active_ratio": (FLOAT, "GPM: share of time the graphics/compute engine was active, 0..1 (DCGM GR_ENGINE_ACTIVE)"),
        "sm_active_ratio": (FLOAT, "GPM: share of SMs busy, 0..1 (DCGM SM_ACTIVE)"),
        "sm_occupancy_ratio": (FLOAT, "GPM: resident warps over the SMs' maximum, 0..1 (DCGM SM_OCCUPANCY)"),
        "tensor_active_ratio": (FLOAT, "GPM: share of time any tensor pipe was active, 0..1 (DCGM PIPE_TENSOR_ACTIVE)"),
        "fp16_active_ratio": (FLOAT, "GPM: share of time the non-tensor FP16 pipe was active, 0..1"),
        "fp32_active_ratio": (FLOAT, "GPM: share of time the non-tensor FP32 pipe was active, 0..1"),
        "fp64_active_ratio": (FLOAT, "GPM: share of time the non-tensor FP64 pipe was active, 0..1"),
        "dram_active_ratio": (FLOAT, "GPM: device memory bandwidth used over its maximum, 0..1 (DCGM DRAM_ACTIVE)"),
        "nvlink_total_rx_bytes_per_second": (FLOAT, "GPM: NVLink receive throughput, all links"),
        "nvlink_total_tx_bytes_per_second": (FLOAT, "GPM: NVLink transmit throughput, all links"),
        "energy_joules_total": (FLOAT, "energy the GPU consumed since the driver loaded (counter)"),
        "remapped_rows_correctable": (INT, "memory rows remapped for correctable errors"),
        "remapped_rows_uncorrectable": (INT, "memory rows remapped for uncorrectable errors"),
        "row_remap_pending": (BOOL, "a row remapping waits for a GPU reset"),
        "row_remap_failed": (BOOL, "a row remapping failed (the GPU needs service)"),
        "nvlink": (OBJS, "per NVLink: link, active (0/1), replay / recovery / crc_flit / crc_data _errors_total (counters), rx / tx _bytes_per_second (GPM)"),
        "nvlink_errors_total": (INT, "NVLink replay, recovery and CRC errors, all links (counter)"),
        "parent_index": (INT, "MIG: the index of the GPU this instance is part of"),
        "mig_profile": (STR, "MIG: the instance's profile, e.g. 1g.10gb"),
        "gpu_instance_id": (INT, "MIG: GPU instance id"),
        "compute_instance_id": (INT, "MIG: compute instance id"),
        "mig_slice_ratio": (FLOAT, "MIG: the instance's share of its parent's SMs, 0..1"),
        "retired_pages_sbe": (INT, "memory pages retired for multiple single-bit ECC errors (Kepler to Turing)"),
        "retired_pages_dbe": (INT, "memory pages retired for a double-bit ECC error (Kepler to Turing)"),
        "retired_pages_pending": (BOOL, "a page retirement waits for a GPU reset"),
        # issue 55: the Kubernetes pod the kubelet gave this GPU to (pod-resources API), or the
        # Slurm job holding it; the event's job is then the pod's job (its job label, else
        # namespace/pod), or slurm-<id>
        "namespace": (STR, "Kubernetes: the namespace of the pod holding this GPU"),
        "pod": (STR, "Kubernetes: the pod holding this GPU"),
        "container": (STR, "Kubernetes: the container of that pod the GPU is assigned to"),
        "slurm_job": (STR, "Slurm: the job holding this GPU (a prolog's GPU map, else the one job all its processes are in)"),
        "slurm_user": (STR, "Slurm: that job's user"),
    }),
    EventType("tpu", "tpu_samples", hot=True, row_form=True, fields={
        "device": (INT, "TPU device (core) id as libtpu numbers it"),
        "hbm_used_bytes": (INT, "high-bandwidth memory in use"),
        "hbm_total_bytes": (INT, "high-bandwidth memory size"),
        "duty_cycle_ratio": (FLOAT, "share of time the TensorCore was busy, 0..1 (per chip)"),
        "hbm_bandwidth_ratio": (FLOAT, "HBM bandwidth utilisation, 0..1, where libtpu reports it"),
    }),
    EventType("gpu_event", "gpu_events", hot=True, fields={
        "index": (INT, "NVML device index"),
        "uuid": (STR, "GPU UUID"),
        "kind": (STR, "xid | ecc_corrected | ecc_uncorrected | lost | row_remap_pending | row_remap_failed | retired_pages_pending"),
        "count": (INT, "how many occurred (ECC: increase since the previous sample)"),
        "xid": (INT, "the Xid code, for kind=xid"),
    }),
    EventType("heartbeat", "heartbeats", hot=True, fields={
        "seq": (INT, "heartbeat number, contiguous within one agent instance, from 1"),
        "instance": (STR, "random id of this agent process start"),
        "agent_version": (STR, "cmdare-agent version"),
        "uptime_seconds": (FLOAT, "seconds since the agent started"),
        "samples_total": (INT, "sampling rounds completed"),
        "events_total": (INT, "events produced"),
        "spooled_total": (INT, "events written to the spool"),
        "shipped_total": (INT, "events acknowledged by Kafka (acks=all)"),
        "dropped_total": (INT, "events dropped: spool bound by size/age, or unwritable"),
        "spool_bytes": (INT, "current spool size on disk"),
        "spool_pending": (INT, "events spooled but not yet acknowledged"),
        "interval_seconds": (FLOAT, "the agent's sampling interval (liveness is judged in these)"),
    }),
    EventType("instance", "instance_identity", fields={
        "cloud": (STR, "gce | aws | azure | none"),
        "region": (STR, "cloud region, e.g. us-central1, us-east-1, westeurope"),
        "zone": (STR, "zone / availability zone"),
        "instance_id": (STR, "the cloud's instance id"),
        "instance_type": (STR, "machine type / instance type / VM size"),
        "name": (STR, "the VM's name where the cloud has one (GCE, Azure)"),
        "spot": (BOOL, "preemptible / spot VM"),
        "accelerator": (STR, "accelerator type (TPU type from GCE, else the NVIDIA driver's GPU model)"),
        "accelerator_count": (INT, "number of accelerators"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds"),
        "launched_at": (FLOAT, "when the cloud began launching the VM, unix seconds (AWS pendingTime; absent "
                               "where the metadata has none)"),
    }),
    EventType("lifecycle", "lifecycle_events", fields={
        "event": (STR, "agent_start | agent_stop | boot | shutdown"),
        "instance": (STR, "random id of this agent process start (as in heartbeats)"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds"),
        "stop_reason": (STR, "agent_stop: what stopped it (SIGTERM, SIGINT, duration, error)"),
        "interval_seconds": (FLOAT, "the agent's sampling interval"),
        "agent_version": (STR, "cmdare-agent version"),
        "uptime_seconds": (FLOAT, "agent_stop: seconds the agent ran"),
        "during_boot": (BOOL, "agent_start: systemd was still booting the VM (the boot started the agent); "
                              "absent without systemd"),
    }),
    EventType("revocation", "revocations", fields={
        "cloud": (STR, "gce | aws | azure"),
        "kind": (STR, "preemption | spot-interruption | maintenance | rebalance | termination | reboot | redeploy | freeze"),
        "action": (STR, "what the cloud will do (AWS action, GCE maintenance value, Azure event type)"),
        "deadline": (FLOAT, "when the cloud acts, unix seconds (the cloud's time, or GCE's documented notice)"),
        "lead_seconds": (FLOAT, "deadline minus the time the agent saw the notice"),
        "notice_id": (STR, "the notice's identity: the same notice is published once"),
        "revokes": (BOOL, "the VM is being taken away (preemption, spot interruption)"),
        "detail": (STR, "the cloud's description, where it gives one"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds (the life the notice ends)"),
    }),
    EventType("train_job", "jobs", fields={
        "run": (STR, "run id (one job can have several runs, e.g. restarts)"),
        "rank": (INT, "rank of this training process"),
        "world_size": (INT, "number of training processes (workers)"),
        "ps": (INT, "number of parameter servers, for parameter-server jobs"),
        "role": (STR, "worker | ps | chief | data | client"),
        "pid": (INT, "process id of the training process"),
        "model": (STR, "model name"),
        "params": (INT, "number of model parameters"),
        "tensors": (INT, "number of parameter tensors"),
        "flops_per_step": (FLOAT, "floating-point operations per training step, when known"),
        "batch_size": (INT, "per-worker batch size"),
        "framework": (STR, "e.g. pytorch, tensorflow, jax"),
        "framework_version": (STR, "framework version"),
        "accelerator": (STR, "accelerator type, e.g. nvidia-a100, tpu-v4"),
        "gpus_per_node": (INT, "training processes (GPUs) per node: torchrun's LOCAL_WORLD_SIZE"),
        "grad_bytes": (INT, "bytes of gradients all-reduced per step (data-parallel: the parameters that require "
                            "a gradient, times their element size)"),
    }),
    EventType("train_steps", "steps", hot=True, fields={
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "interval_seconds": (FLOAT, "length of the aggregation interval"),
        "steps": (INT, "steps completed in the interval"),
        "first_step": (INT, "number of the first step in the interval"),
        "last_step": (INT, "number of the last step in the interval"),
        "examples": (FLOAT, "examples (or tokens) processed in the interval"),
        "step_mean_seconds": (FLOAT, "mean step time (input wait included)"),
        "step_p50_seconds": (FLOAT, "median step time"),
        "step_p95_seconds": (FLOAT, "95th percentile step time"),
        "step_max_seconds": (FLOAT, "longest step"),
        "wait_mean_seconds": (FLOAT, "mean input wait per step (blocked on the next batch)"),
        "wait_p50_seconds": (FLOAT, "median input wait"),
        "wait_p95_seconds": (FLOAT, "95th percentile input wait"),
        "wait_max_seconds": (FLOAT, "longest input wait"),
        "wait_share_ratio": (FLOAT, "input wait / step time over the interval, 0..1"),
        "steps_per_second": (FLOAT, "steps per second over the time the steps covered"),
        "examples_per_second": (FLOAT, "examples per second over the time the steps covered"),
        "dropped_total": (INT, "step records the tracking library could not deliver (counter)"),
        "comm_mean_seconds": (FLOAT, "mean communication wait per step: the training thread blocked on gradient "
                              "communication (all-reduce) that computation did not hide; absent when not reported"),
        "comm_share_ratio": (FLOAT, "communication wait / step time over the interval, 0..1"),
    }),
    EventType("train_data", "data_batches", fields={
        "run": (STR, "run id"),
        "rank": (INT, "rank of the input (data) worker process"),
        "interval_seconds": (FLOAT, "length of the aggregation interval"),
        "batches": (INT, "batches produced in the interval"),
        "elements": (FLOAT, "elements (examples) in those batches"),
        "process_mean_seconds": (FLOAT, "mean time to produce one batch (its processing time)"),
        "process_p50_seconds": (FLOAT, "median time to produce one batch"),
        "process_p95_seconds": (FLOAT, "95th percentile time to produce one batch"),
        "idle_mean_seconds": (FLOAT, "mean time per batch spent handing it over (blocked on consumers)"),
        "idle_share_ratio": (FLOAT, "idle / (processing + idle) over the interval, 0..1"),
        "batches_per_second": (FLOAT, "batches per second over the time the batches covered"),
        "dropped_total": (INT, "records the tracking library could not deliver (counter)"),
    }),
    EventType("train_slow_step", "slow_steps", fields={
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "step": (INT, "step number"),
        "step_seconds": (FLOAT, "this step's time"),
        "wait_seconds": (FLOAT, "this step's input wait"),
        "median_seconds": (FLOAT, "the rank's recent median step time it was compared with"),
        "examples": (FLOAT, "examples in this step"),
    }),
    EventType("train_scalar", "scalars", fields={
        "run": (STR, "run id (TensorBoard: the event file's directory under the log dir)"),
        "rank": (INT, "rank of the training process"),
        "tag": (STR, "scalar name, e.g. loss"),
        "step": (INT, "training step the value belongs to"),
        "value": (FLOAT, "the value"),
    }),
    EventType("train_checkpoint", "checkpoints", fields={
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "action": (STR, "save | restore"),
        "seconds": (FLOAT, "time the save or restore took"),
        "bytes": (INT, "checkpoint size"),
        "step": (INT, "step the checkpoint belongs to"),
        "path": (STR, "where it was written or read"),
        "ok": (BOOL, "false when the save or restore raised"),
        "error": (STR, "the exception, when not ok"),
    }),
    EventType("train_end", "run_ends", fields={
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "state": (STR, "finished | failed | interrupted (the process said so) | crashed (the agent saw its "
                       "process gone without an end)"),
        "exit_code": (INT, "failed: the exit code (SystemExit), when there was one"),
        "signal": (STR, "interrupted: the signal's name (SIGINT)"),
        "error": (STR, "failed: the exception's type and message (at most 500 characters)"),
        "steps": (INT, "steps the process recorded (crashed: the last step number the agent saw)"),
        "pid": (INT, "the process id, as the agent's kernel named the sender"),
    }),
    EventType("status", "agent_status", hot=True, fields={
        "source": (STR, "source or sink name, e.g. gpu, host, sink.kafka"),
        "ok": (BOOL, "whether the last collect/ship succeeded"),
        "state": (STR, "ok | error | unavailable"),
        "duration_seconds": (FLOAT, "time the last collect took"),
        "message": (STR, "why, when not ok or when the state changed"),
    }),
)}


ENVELOPE_KEYS = ("v", "id", "ts", "node", "role", "job", "labels", "type", "data")
MAX_ID_LEN = 64
MAX_NAME_LEN = 256
TRAIN_PREFIX = "train_"  # training processes' types: their envelope job is the training job's
# ... and the agent's GPU samples: a GPU a Kubernetes pod or Slurm job holds is sent as that job's
HELD_JOB_TYPES = ("gpu",)


# views of the registry that most code reads
DATA_FIELDS: dict[str, dict[str, tuple[str, str]]] = {n: t.fields for n, t in TYPES.items()}
TABLES: dict[str, str] = {n: t.table for n, t in TYPES.items()}
ROW_TYPES: tuple[str, ...] = tuple(n for n, t in TYPES.items() if t.row_form)
HOT_TYPES: tuple[str, ...] = tuple(n for n, t in TYPES.items() if t.hot)

# check_circular off: event data is built by the agent's own code from numbers, strings and
# parsed JSON, never self-referencing, and the check costs a third of encoding a sample
JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True, check_circular=False)

# the row form's line head (see rowform.py): its prefix, then these envelope fields
ROW_PREFIX = "r1"
ROW_ENVELOPE = ("type", "id", "ts", "node", "role", "job", "labels")
