"""toolrail: serverless tool execution for LLM agents.

The small shared package: settings, correlation context, logging setup, the
embedded Redis and the umbrella CLI. It imports nothing from the stage packages
except inside the CLI, which sits on top of everything.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
