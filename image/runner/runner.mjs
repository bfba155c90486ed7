#!/usr/bin/env node
// The in-container runner: turns /job into one pi invocation and reports back by exit code.
//
//   exit 0  completed (including "I could not fix this")
//   exit 1  infrastructure (provider 5xx/429/network, pi crashed): the worker retries
//   exit 2  policy (turn or token budget, refused credentials, bad job): never retried
//
// It streams pi's JSON events to stdout as they come, and its last stdout line is always
//   {"event":"exit","code":N,"turns":T,"tokens":{...},"usage":{"v":1,"models":[...]},"reason":"..."}
// which the worker treats as untrusted telemetry. Just before it, when pi's last assistant message had text,
//   {"event":"summary","text":"..."}    (at most SUMMARY_CHARS characters)
// the agent's own account of its work, which the worker publishes (the pull request's body, or a comment). The turn budget comes from the environment the worker
// sets (PI_MAX_TURNS); tokens are counted and bounded outside the container, by the job's egress gateway.
//
// Egress (runner protocol 2): the container has no network but loopback. The worker bind-mounts its
// gateway's unix sockets under /run/pi-egress; this process listens on 127.0.0.1 and pipes every connection
// to them: :8080 -> provider.sock (pi's models.json points its provider here; the gateway adds the key) and
// :3128 -> proxy.sock (HTTP(S)_PROXY: CONNECT and absolute-form requests, refused unless allowed).
//
// Sessions: with /session mounted (a `run.resume` job), pi runs `--session /session/session.jsonl` (it opens the
// transcript the worker copied there, or starts one at that path; it writes it once a model answered);
// otherwise `--no-session`.

import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { connect, createServer } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const RUNNER_PROTOCOL = "3";

const EXIT_COMPLETED = 0;
const EXIT_INFRASTRUCTURE = 1;
const EXIT_POLICY = 2;
const BUILTIN_TOOLS = ["read", "bash", "edit", "write"];
const MAX_MODEL_ROWS = 8;
const SUMMARY_CHARS = 8000;

const env = process.env;
const jobDir = env.PI_RUNNER_JOB_DIR || "/job";
const egressDir = env.PI_RUNNER_EGRESS_DIR || "/run/pi-egress";
// A `run.resume` job's session folder, mounted read-write by the worker only for such a job: pi continues the
// transcript there (or starts it), and the worker keeps it for the target's next job when the run completes.
const sessionDir = env.PI_RUNNER_SESSION_DIR || "/session";
const piBin = env.PI_BIN || "pi";
// The ports are the protocol's; PI_RUNNER_EGRESS_PORTS=<provider>,<proxy> moves them for the runner's tests.
const [providerPort, proxyPort] = (env.PI_RUNNER_EGRESS_PORTS || "8080,3128").split(",").map(Number);
const FORWARDERS = [
  { port: providerPort, socket: "provider.sock" },
  { port: proxyPort, socket: "proxy.sock" },
];

function positiveInt(value) {
  const number = Number.parseInt(value ?? "", 10);
  return Number.isSafeInteger(number) && number > 0 ? number : null;
}

const maxTurns = positiveInt(env.PI_MAX_TURNS) ?? 30;

const ledger = new Map(); // "provider/model" -> usage row
let turns = 0;
let lastAssistant = null;
let stopping = null; // {code, reason} once the runner decided to stop pi

function emit(object) {
  process.stdout.write(`${JSON.stringify(object)}\n`);
}

function totals() {
  const sum = { input: 0, output: 0, total: 0, cost: 0 };
  for (const row of ledger.values()) {
    sum.input += row.input;
    sum.output += row.output;
    sum.total += row.total;
    sum.cost += row.cost;
  }
  sum.cost = Math.round(sum.cost * 1e6) / 1e6;
  return sum;
}

function usageBlock() {
  const rows = [...ledger.values()].sort((a, b) => b.total - a.total);
  const named = rows.slice(0, MAX_MODEL_ROWS);
  const rest = rows.slice(MAX_MODEL_ROWS);
  if (rest.length) {
    const fold = { provider: "other", model: "other", calls: 0, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0, cost: 0 };
    for (const row of rest) for (const key of Object.keys(fold)) if (typeof row[key] === "number") fold[key] += row[key];
    named.push(fold);
  }
  return { v: 1, models: named.map((row) => ({ ...row, cost: Math.round(row.cost * 1e6) / 1e6 })) };
}

function summaryText(message) {
  const blocks = Array.isArray(message?.content) ? message.content : [];
  const text = blocks
    .filter((block) => block && block.type === "text" && typeof block.text === "string")
    .map((block) => block.text)
    .join("\n\n")
    .trim();
  return text.length > SUMMARY_CHARS ? text.slice(0, SUMMARY_CHARS) : text;
}

function finish(code, reason) {
  const summary = summaryText(lastAssistant);
  if (summary) emit({ event: "summary", text: summary });
  const line = { event: "exit", code, turns, tokens: totals(), usage: ledger.size ? usageBlock() : null };
  if (reason) line.reason = reason;
  emit(line);
  process.exit(code);
}

function count(value) {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : 0;
}

function recordUsage(message) {
  const usage = message.usage || {};
  const provider = String(message.provider || "unknown").toLowerCase();
  const model = String(message.model || "unknown").toLowerCase();
  const key = `${provider}/${model}`;
  const row = ledger.get(key) || { provider, model, calls: 0, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0, cost: 0 };
  row.calls += 1;
  row.input += count(usage.input);
  row.output += count(usage.output);
  row.cacheRead += count(usage.cacheRead);
  row.cacheWrite += count(usage.cacheWrite);
  row.total += count(usage.totalTokens);
  row.cost += count(usage.cost && usage.cost.total);
  ledger.set(key, row);
}

// A provider error's class decides the exit: refused credentials are policy, the rest is retried.
function classifyError(message) {
  const text = String(message.errorMessage || "");
  const status = Number.parseInt((text.match(/\b([1-5]\d\d)\b/) || [])[1] || "", 10);
  if (status === 401 || status === 403 || /invalid (x-)?api[ -]?key|authentication/i.test(text)) {
    return { code: EXIT_POLICY, reason: "provider-auth-refused" };
  }
  return { code: EXIT_INFRASTRUCTURE, reason: null };
}

function stop(child, code, reason) {
  if (stopping) return;
  stopping = { code, reason };
  child.kill("SIGTERM");
  setTimeout(() => child.kill("SIGKILL"), 5000).unref();
}

function piArguments() {
  const args = ["-p", "--mode", "json"];
  if (existsSync(sessionDir)) args.push("--session", join(sessionDir, "session.jsonl"));
  else args.push("--no-session");
  if (env.PI_PROVIDER) args.push("--provider", env.PI_PROVIDER);
  if (env.PI_MODEL) args.push("--model", env.PI_MODEL);
  // The allowed-model list (provider/model,...): pi chooses among these; the gateway refuses any other.
  if (env.PI_ALLOWED_MODELS) args.push("--models", env.PI_ALLOWED_MODELS);
  const excluded = new Set((env.PI_EXCLUDE_TOOLS || "").split(",").map((name) => name.trim()).filter(Boolean));
  if (excluded.size) args.push("--tools", BUILTIN_TOOLS.filter((name) => !excluded.has(name)).join(","));
  const skills = join(jobDir, "pi", "skills");
  if (existsSync(skills)) args.push("--skill", skills);
  args.push(...resourceArguments());
  const persona = join(jobDir, "pi", "APPEND_SYSTEM.md");
  if (existsSync(persona)) args.push("--append-system-prompt", persona);
  // The prompt travels as a file reference: an issue body can be larger than one argv string may be.
  args.push(`@${join(jobDir, "prompt.md")}`);
  if (env.PI_COMMAND) args.push(`/${env.PI_COMMAND}`);
  return args;
}

// What the worker wrote into /job/pi-resources.json (the operator's overlay at /opt/pi-global, its staged packages,
// a trigger's skills folder): pi packages as -e, skill folders as --skill, prompt folders as --prompt-template.
// Flags, not a settings.json: pi locks its settings file before reading it, which fails on the read-only /job.
const RESOURCE_FLAGS = { extensions: "-e", skills: "--skill", promptTemplates: "--prompt-template" };

function resourceArguments() {
  let resources;
  try {
    resources = JSON.parse(readFileSync(join(jobDir, "pi-resources.json"), "utf8"));
  } catch {
    return []; // none written (an older worker), or unreadable: pi runs with what it finds itself
  }
  const args = [];
  for (const [key, flag] of Object.entries(RESOURCE_FLAGS)) {
    const paths = Array.isArray(resources?.[key]) ? resources[key] : [];
    for (const path of paths) {
      if (typeof path === "string" && path.startsWith("/") && existsSync(path)) args.push(flag, path);
    }
  }
  return args;
}

// One loopback listener per gateway socket that is there; each connection is piped to the socket as is.
function forward({ port, socket }) {
  const path = join(egressDir, socket);
  if (!existsSync(path)) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const server = createServer((client) => {
      const upstream = connect(path);
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on("error", close);
      upstream.on("error", close);
      client.pipe(upstream);
      upstream.pipe(client);
    });
    server.on("error", reject);
    server.listen(port, "127.0.0.1", () => resolve(server));
  });
}

async function main() {
  const prompt = join(jobDir, "prompt.md");
  if (!existsSync(prompt) || !readFileSync(prompt, "utf8").trim()) finish(EXIT_POLICY, "runner-config");
  if (!env.PI_FLOW && !env.PI_COMMAND) finish(EXIT_POLICY, "runner-config");
  try {
    await Promise.all(FORWARDERS.map(forward));
  } catch {
    finish(EXIT_INFRASTRUCTURE, null); // a loopback port taken: nothing of the job has run yet
  }

  const child = spawn(piBin, piArguments(), { stdio: ["ignore", "pipe", "inherit"], env });
  child.on("error", () => finish(EXIT_INFRASTRUCTURE, null)); // pi missing or not executable

  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.on(signal, () => {
      // The worker is stopping this container (timeout, cancel): pass it on and report what we have.
      stop(child, EXIT_INFRASTRUCTURE, null);
    });
  }

  const lines = createInterface({ input: child.stdout, crlfDelay: Infinity });
  lines.on("line", (line) => {
    process.stdout.write(`${line}\n`);
    let event;
    try {
      event = JSON.parse(line);
    } catch {
      return; // not an event line
    }
    if (!event || typeof event !== "object") return;
    if (event.type === "turn_start") {
      turns += 1;
      if (turns > maxTurns) stop(child, EXIT_POLICY, "turn-budget");
    } else if (event.type === "message_end" && event.message && event.message.role === "assistant") {
      lastAssistant = event.message;
      recordUsage(event.message);
    }
  });

  child.on("close", (code, signal) => {
    if (stopping) finish(stopping.code, stopping.reason);
    if (code !== 0 || signal) finish(EXIT_INFRASTRUCTURE, null);
    if (lastAssistant && lastAssistant.stopReason === "error") {
      const verdict = classifyError(lastAssistant);
      finish(verdict.code, verdict.reason);
    }
    if (lastAssistant && lastAssistant.stopReason === "aborted") finish(EXIT_INFRASTRUCTURE, null);
    finish(EXIT_COMPLETED, null);
  });
}

main();
