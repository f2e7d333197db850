"""cmdare-agent: samples a training VM and ships versioned telemetry events.

The agent is installed on every accelerator VM, so this package imports only its own
small dependencies (psutil, nvidia-ml-py, kafka-python, a TOML reader) and never
anything from the collector or analytics side.
"""

__version__ = "0.1.0"
