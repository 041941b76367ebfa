// A tiny MCP server over stdio (newline-delimited JSON-RPC 2.0) with one tool,
// `lookup_secret_word`, for the conformance test that Cursor's SDK offers and calls MCP tools
// through the proxy. It answers `initialize`, `tools/list` and `tools/call`; notifications get
// no answer; any other method gets a JSON-RPC "method not found" error.

import readline from "node:readline";

const SECRET = process.env.SECRET_WORD ?? "pelican";

function send(msg) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
}

const TOOL = {
  name: "lookup_secret_word",
  description: "Returns the secret word for a topic.",
  inputSchema: {
    type: "object",
    properties: { topic: { type: "string", description: "what the word is about" } },
    required: ["topic"],
  },
};

function handle(req) {
  switch (req.method) {
    case "initialize":
      return {
        protocolVersion: req.params?.protocolVersion ?? "2024-11-05",
        capabilities: { tools: {} },
        serverInfo: { name: "conformance-tools", version: "1.0.0" },
      };
    case "tools/list":
      return { tools: [TOOL] };
    case "tools/call": {
      const topic = req.params?.arguments?.topic ?? "";
      return { content: [{ type: "text", text: `The secret word for ${topic} is ${SECRET}.` }] };
    }
    case "ping":
      return {};
    default:
      return undefined;
  }
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  if (req.id === undefined || req.id === null) return; // a notification
  const result = handle(req);
  if (result === undefined) {
    send({ id: req.id, error: { code: -32601, message: `method not found: ${req.method}` } });
  } else {
    send({ id: req.id, result });
  }
});
