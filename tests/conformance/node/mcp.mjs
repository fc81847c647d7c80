// The TypeScript MCP SDK against toolrail, over streamable HTTP (/mcp, with an API key) and stdio (`toolrail mcp
// stdio`), as a host would: for each transport, the checks of tests/conformance/test_mcp.py, printed as
// {"<transport>: <check>": {ok, detail}}. Run by that test with TOOLRAIL_MCP_HTTP (JSON {url, headers}: the API
// key) and TOOLRAIL_MCP_STDIO (JSON {command, args, env, cwd}: how a host launches the server).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, LATEST_PROTOCOL_VERSION, McpError } from "@modelcontextprotocol/sdk/types.js";

const CHECKS = {
  connect: "connect: the client's newest protocol version, the tools capability, serverInfo",
  list: "tools/list: every tool with an object inputSchema",
  call: "tools/call: structuredContent, and its JSON as the text block",
  unknown: "tools/call of an unknown tool: the JSON-RPC error -32602",
};
const CALL = { timeout: 120000 };  // the first sandboxed call of a fresh worker is slow on a loaded machine
const results = {};

function assert(condition, message) {
  if (!condition) throw new Error(message);
}

async function check(transport, name, body) {
  try {
    results[`${transport}: ${CHECKS[name]}`] = { ok: true, detail: await body() };
  } catch (error) {
    results[`${transport}: ${CHECKS[name]}`] = { ok: false, detail: String(error && error.stack || error) };
  }
}

// The protocolVersion of the server's initialize result, as it arrives (the client reads it, then keeps it private).
function answeredVersion(transport) {
  let version, handler;
  Object.defineProperty(transport, "onmessage", { configurable: true, get: () => handler, set: (next) => {
    handler = next && ((message, extra) => {
      version = version || (message.result && message.result.protocolVersion);
      next(message, extra);
    });
  } });
  return () => version;
}

async function drive(name, transport) {
  const client = new Client({ name: "toolrail-conformance", version: "1.0.0" });
  const negotiated = answeredVersion(transport);
  let connected = false;
  await check(name, "connect", async () => {
    await client.connect(transport);  // sends LATEST_PROTOCOL_VERSION; refuses a version it does not support
    connected = true;
    const version = negotiated();  // the spec: a server that supports the requested version answers with it
    assert(version === LATEST_PROTOCOL_VERSION, `asked ${LATEST_PROTOCOL_VERSION}, answered ${version}`);
    assert(client.getServerCapabilities().tools, JSON.stringify(client.getServerCapabilities()));
    assert(client.getServerVersion().name && client.getServerVersion().version, JSON.stringify(client.getServerVersion()));
    return { version, server: client.getServerVersion() };
  });
  if (!connected) {
    for (const rest of ["list", "call", "unknown"]) await check(name, rest, async () => assert(false, "not connected"));
    return;
  }
  await check(name, "list", async () => {
    const { tools } = await client.listTools();  // parsed by the SDK's ListToolsResultSchema
    const weather = tools.find((t) => t.name === "get_weather");
    assert(weather && weather.inputSchema.type === "object", JSON.stringify(tools.map((t) => t.name)));
    assert(tools.every((t) => t.inputSchema.type === "object"), "a tool whose inputSchema is not an object");
    return tools.length;
  });
  await check(name, "call", async () => {
    // the SDK checks structuredContent against the listed outputSchema when the tool declares one
    const result = await client.callTool({ name: "get_weather", arguments: { city: "Paris", date: "today" } },
                                         undefined, CALL);
    assert(result.isError !== true, JSON.stringify(result.content));
    assert(result.structuredContent && result.structuredContent.city === "Paris", JSON.stringify(result));
    assert(result.content[0].type === "text", JSON.stringify(result.content));
    assert(JSON.stringify(JSON.parse(result.content[0].text)) === JSON.stringify(result.structuredContent),
           `the text block is not the structured content serialized: ${result.content[0].text}`);
    return result.structuredContent;
  });
  await check(name, "unknown", async () => {
    try {
      await client.callTool({ name: "no_such_tool", arguments: {} }, undefined, CALL);
    } catch (error) {
      assert(error instanceof McpError && error.code === ErrorCode.InvalidParams, `${error.code} ${error.message}`);
      return error.code;
    }
    throw new Error("an unknown tool answered with a result, not the JSON-RPC error");
  });
  await client.close();
}

const http = JSON.parse(process.env.TOOLRAIL_MCP_HTTP);
await drive("mcp http", new StreamableHTTPClientTransport(new URL(http.url), { requestInit: { headers: http.headers } }));
await drive("mcp stdio", new StdioClientTransport(JSON.parse(process.env.TOOLRAIL_MCP_STDIO)));

console.log(JSON.stringify(results));
