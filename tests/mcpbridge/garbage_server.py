"""A stdio "MCP server" written by hand that answers the handshake and tools/list properly, then, on
``tools/call``, writes a line that is not JSON-RPC to stdout (what a server that prints debugging output
to its protocol channel does) and waits.
"""

import json
import sys
import time


def reply(message_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        reply(message["id"], {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                              "serverInfo": {"name": "garbage", "version": "0"}})
    elif method == "tools/list":
        reply(message["id"], {"tools": [{"name": "talk", "inputSchema": {"type": "object", "properties": {}}}]})
    elif method == "tools/call":
        sys.stdout.write("DEBUG: entering talk() ... this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(30)
    elif "id" in message:
        reply(message["id"], {})
