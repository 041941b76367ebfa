// Drives one agent turn with Cursor's published SDK (`@cursor/sdk`) as a black box and prints
// everything it sees as JSON lines on stdout (one object per line, field `ev` names the kind).
// `tests/conformance.rs` runs it against the proxy's direct doors and asserts on the lines.
//
// Usage: node client.mjs '<json options>'
//   mode        "create" (new agent) | "resume" (a later turn of `agentId`, in a new process)
//   agentId     for "resume"
//   prompt      the user message
//   model       model id as Cursor sees it (`byok-…`)
//   storeDir    folder of the SDK's JSONL agent store (blobs, checkpoints) — shared between turns
//   timeoutMs   hard timeout: prints {"ev":"timeout"} and exits 3
//   cancelOn    optional: "text-delta" cancels the run at its first text delta
//   hosts       names resolved to 127.0.0.1 (everything else fails to resolve)
//   retries     optional: true turns the SDK's agent retries on (default off, so failures show)
//   settingSources optional: the SDK's `local.settingSources` (default [], no workspace rules)
//   mcpServers  optional: the SDK's `mcpServers` option (e.g. a stdio server)
//   systemPrompt optional: the SDK's `systemPrompt` option
//   agents      optional: the SDK's `agents` option (custom subagents)
//   sendMode    optional: the conversation mode of this send ("agent" | "plan")
//   steerOn     optional: an update type ("tool-call-started"): at the first one, `run.steer`
//               with `steerText`; prints {"ev":"steer","outcome":…}
//
// The SDK reads CURSOR_BACKEND_URL when it is imported, so the environment (backend URL,
// NODE_EXTRA_CA_CERTS, HOME, CURSOR_SDK_LOCAL_MODEL_CATALOG_JSON) comes from the caller. Real host
// names are mapped here instead of using `localhost`: for localhost URLs the SDK turns TLS
// verification off, which would hide certificate bugs.
//
// Exit codes: 0 the run finished, 1 the run ended in error/cancelled (events tell which),
// 2 the script or SDK threw, 3 hard timeout.

import dns from "node:dns";
import http from "node:http";
import http2 from "node:http2";
import https from "node:https";
import { syncBuiltinESMExports } from "node:module";

const opts = JSON.parse(process.argv[2] ?? "{}");
const started = Date.now();

const emitted = new Set();
const stdoutHas = (ev) => emitted.has(ev);

function emit(ev, fields = {}) {
  emitted.add(ev);
  const line = JSON.stringify({ ev, t: Date.now() - started, ...fields }, (_k, v) =>
    typeof v === "bigint" ? Number(v) : v,
  );
  process.stdout.write(line + "\n");
}

function describeError(e) {
  if (e === null || typeof e !== "object") return { message: String(e) };
  const out = {
    name: e.name,
    message: e.message,
    code: e.code,
    isRetryable: e.isRetryable,
  };
  if (e.cause) out.cause = describeError(e.cause);
  return out;
}

const hardTimeout = setTimeout(() => {
  emit("timeout", { after_ms: opts.timeoutMs });
  process.exit(3);
}, opts.timeoutMs ?? 60_000);

process.on("unhandledRejection", (e) => emit("unhandled", { error: describeError(e) }));

// --- Name resolution: only our names, and only to loopback. -----------------------------------
const mapped = new Set(opts.hosts ?? []);
const originalLookup = dns.lookup;
dns.lookup = function lookup(hostname, options, callback) {
  if (typeof options === "function") {
    callback = options;
    options = {};
  } else if (typeof options === "number") {
    options = { family: options };
  }
  options ??= {};
  const host = String(hostname).toLowerCase();
  if (mapped.has(host)) {
    emit("dns", { host, mapped: true });
    if (options.all) {
      process.nextTick(callback, null, [{ address: "127.0.0.1", family: 4 }]);
    } else {
      process.nextTick(callback, null, "127.0.0.1", 4);
    }
    return {};
  }
  if (host === "localhost" || /^[0-9.]+$/.test(host) || host.includes(":")) {
    return originalLookup.call(this, hostname, options, callback);
  }
  emit("dns", { host, mapped: false });
  const err = Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), {
    code: "ENOTFOUND",
    hostname,
  });
  process.nextTick(callback, err);
  return {};
};

// --- Wire log: which RPCs go out, on which HTTP version, and what comes back. -----------------
const LOGGED_HEADERS = [
  "content-type",
  "connect-protocol-version",
  "connect-content-encoding",
  "connect-accept-encoding",
  "content-encoding",
  "transfer-encoding",
  "x-cursor-client-type",
  "x-cursor-client-version",
  "x-ghost-mode",
  "user-agent",
  "x-request-id",
];

function pickHeaders(headers) {
  const out = {};
  const names = [];
  for (const [k, v] of Object.entries(headers ?? {})) {
    const name = k.toLowerCase();
    names.push(name);
    if (LOGGED_HEADERS.includes(name)) out[name] = Array.isArray(v) ? v.join(", ") : String(v);
  }
  return { headers: out, header_names: names.sort() };
}

const originalConnect = http2.connect;
http2.connect = function connect(authority, ...rest) {
  const session = originalConnect.call(this, authority, ...rest);
  const url = typeof authority === "string" ? authority : String(authority?.href ?? authority);
  emit("net", { kind: "h2-connect", url });
  session.once?.("connect", () =>
    emit("net", { kind: "h2-session", url, alpn: session.alpnProtocol ?? null }),
  );
  const originalRequest = session.request;
  session.request = function request(headers, ...more) {
    const stream = originalRequest.call(this, headers, ...more);
    const path = headers?.[":path"];
    emit("net", {
      kind: "h2-request",
      url,
      method: headers?.[":method"] ?? "GET",
      path,
      ...pickHeaders(headers),
    });
    stream.once("response", (h) =>
      emit("net", { kind: "h2-response", path, status: h[":status"], ...pickHeaders(h) }),
    );
    stream.once("close", () =>
      emit("net", { kind: "h2-close", path, rst_code: stream.rstCode ?? null }),
    );
    return stream;
  };
  return session;
};

function wrapRequest(mod, scheme) {
  for (const fn of ["request", "get"]) {
    const original = mod[fn];
    mod[fn] = function wrapped(...args) {
      const req = original.apply(this, args);
      const host = req.host ?? req.getHeader?.("host");
      emit("net", {
        kind: "h1-request",
        scheme,
        method: req.method,
        host,
        path: req.path,
        ...pickHeaders(req.getHeaders?.()),
      });
      req.once("response", (res) => {
        emit("net", {
          kind: "h1-response",
          path: req.path,
          status: res.statusCode,
          version: res.httpVersion,
          ...pickHeaders(res.headers),
        });
        res.once("close", () =>
          emit("net", { kind: "h1-close", path: req.path, complete: res.complete }),
        );
      });
      return req;
    };
  }
}
wrapRequest(http, "http");
wrapRequest(https, "https");
syncBuiltinESMExports();

const originalFetch = globalThis.fetch;
globalThis.fetch = async function fetch(input, init) {
  const url = typeof input === "string" ? input : (input?.url ?? String(input));
  const method = init?.method ?? input?.method ?? "GET";
  emit("net", { kind: "fetch", method, url });
  try {
    const res = await originalFetch(input, init);
    emit("net", {
      kind: "fetch-response",
      url,
      status: res.status,
      "content-type": res.headers.get("content-type"),
    });
    return res;
  } catch (e) {
    emit("net", { kind: "fetch-error", url, error: describeError(e) });
    throw e;
  }
};

// --- The turn. ---------------------------------------------------------------------------------
const sdk = await import("@cursor/sdk");
const { Agent, JsonlLocalAgentStore } = sdk;

async function main() {
  const store = new JsonlLocalAgentStore(opts.storeDir);
  const agentOptions = {
    apiKey: opts.apiKey ?? "key_conformance_test",
    model: { id: opts.model, params: [] },
    local: {
      cwd: process.cwd(),
      store,
      enableAgentRetries: opts.retries === true,
      settingSources: opts.settingSources ?? [],
    },
  };
  if (opts.mcpServers) agentOptions.mcpServers = opts.mcpServers;
  if (opts.systemPrompt) agentOptions.systemPrompt = opts.systemPrompt;
  if (opts.agents) agentOptions.agents = opts.agents;
  const agent =
    opts.mode === "resume"
      ? await Agent.resume(opts.agentId, agentOptions)
      : await Agent.create(agentOptions);
  emit("agent", { agentId: agent.agentId });

  let run;
  let canceling = false;
  const cancelOnce = (why) => {
    if (canceling || !run) return;
    canceling = true;
    emit("cancel", { why });
    run.cancel().then(
      () => emit("cancel-done"),
      (e) => emit("cancel-error", { error: describeError(e) }),
    );
  };
  const pending = [];
  let steered = false;
  const steerOnce = () => {
    if (steered || !run?.steer) return;
    steered = true;
    emit("steer-sent", { text: opts.steerText });
    run.steer(opts.steerText).then(
      (outcome) => emit("steer", { outcome }),
      (e) => emit("steer-error", { error: describeError(e) }),
    );
  };
  const sendOptions = opts.sendMode ? { mode: opts.sendMode } : {};
  run = await agent.send(opts.prompt, {
    ...sendOptions,
    onDelta: ({ update }) => {
      emit("delta", { update });
      if (opts.steerOn && update?.type === opts.steerOn) {
        if (run) steerOnce();
        else pending.push("steer");
      }
      if (opts.cancelOn && update?.type === opts.cancelOn) {
        // `run` is set once `send` resolves; deltas can come earlier.
        if (run) cancelOnce(`first ${opts.cancelOn}`);
        else pending.push(opts.cancelOn);
      }
    },
    onStep: ({ step }) => emit("step", { step }),
  });
  emit("run", { id: run.id, requestId: run.requestId ?? null, status: run.status });
  run.onDidChangeStatus?.((status) => emit("status", { status }));
  if (pending.includes("steer")) steerOnce();
  else if (pending.length) cancelOnce(`first ${pending[0]} (before send resolved)`);

  const result = await run.wait();
  // Stay a while with the agent open: work that ends after the run (a background subagent)
  // reports to it as a run of its own.
  if (opts.lingerMs) await new Promise((r) => setTimeout(r, opts.lingerMs));
  // A steer still waiting for its acknowledgement settles before we report.
  for (let i = 0; steered && i < 50 && !stdoutHas("steer"); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  emit("result", { result: { ...result, error: result.error ?? null } });
  try {
    agent.close();
  } catch (e) {
    emit("close-error", { error: describeError(e) });
  }
  return result.status === "finished" ? 0 : 1;
}

let code;
try {
  code = await main();
} catch (e) {
  emit("error", { error: describeError(e), stack: String(e?.stack ?? "").split("\n").slice(0, 8) });
  code = 2;
}
clearTimeout(hardTimeout);
emit("exit", { code });
process.exit(code);
