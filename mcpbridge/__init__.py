"""MCP both ways: toolrail as an MCP server (``/mcp``, ``toolrail mcp stdio``) and MCP servers as tool providers."""
