"""Framework adapters for ``cmdare.agent.track``.  Each module imports its framework, so
import only the one you use (``from cmdare.agent.adapters.keras import CmdareCallback``);
nothing here is imported by the agent itself."""
