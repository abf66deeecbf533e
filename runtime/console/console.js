// The Wakeful console: one entity at a time, over the gateway's HTTP API.
//
// The chat is drawn from the entity's event stream (GET .../events?live=1, read
// with fetch so that it can carry the Authorization header): durable events
// draw messages, tool calls and run outcomes; live events stream the text of
// the step being generated and tool progress. A dropped stream is resumed with
// Last-Event-ID, so nothing is drawn twice or missed. The side panels (status,
// pending actions, children, state) are re-read after durable events.
//
// The page offers one client tool to the agent, getSelectedText, and answers it
// itself with the text selected in the "Page text" panel.
//
// The operator's views (every entity, workers, an entity's journal and tree, the
// resume/cancel/delete buttons) are in ops.js, loaded after this file.
"use strict";

const CLIENT_TOOLS = [
  {
    name: "getSelectedText",
    description:
      "client.getSelectedText: the text the user has selected in their console page " +
      "(empty if nothing is selected). Answered by the user's browser.",
    input_schema: { type: "object", properties: {} },
    output_schema: {
      type: "object",
      properties: { text: { type: "string" } },
      required: ["text"],
    },
  },
];

const $ = (selector) => document.querySelector(selector);
// Log entries drawn when an entity is opened (the rest on request); ?history=N sets it.
const HISTORY = Number(new URLSearchParams(location.search).get("history")) || 400;

const app = {
  url: null, // "/type/id" of the open entity
  generation: 0, // bumped by every open: work started for an older open stops
  stream: null, // AbortController of the event stream
  stepBubbles: new Map(), // "<run id>:<step>" -> the agent bubble of that model step
  runText: false, // the open run has shown agent text
  toolCards: new Map(), // tool_call_id -> element
  answering: new Set(), // client tool calls answered (or being answered) by this page
  sent: new Set(), // event ids of the messages this browser sent to the open entity
  runSources: new Map(), // run id -> ids of the messages it took (from user_turn events)
  refreshes: 0, // the latest side-panel read; older answers are dropped
  selection: "",
  refreshTimer: null,
  tab: "chat", // the open entity's view: chat | journal | tree
  listing: 0, // the latest sidebar listing; older answers are dropped
};

// -- HTTP ------------------------------------------------------------------------

function requestHeaders(extra = {}) {
  const headers = { "content-type": "application/json", ...extra };
  const token = $("#token").value.trim();
  if (token) headers.authorization = `Bearer ${token}`;
  return headers;
}

class ApiError extends Error {
  constructor(status, message, kind = null) {
    super(message);
    this.status = status;
    this.kind = kind; // the error type the gateway named (UnknownEntityTypeError, ...)
  }
}

async function api(method, path, body, extraHeaders) {
  const response = await fetch(path, {
    method,
    headers: requestHeaders(extraHeaders),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const detail = data && data.error ? `${data.error.type}: ${data.error.message}` : text;
    const kind = data && data.error ? data.error.type : null;
    throw new ApiError(response.status, `${method} ${path} failed (${response.status}): ${detail}`, kind);
  }
  return data;
}

function entityPath(url, suffix = "") {
  const [, type, id] = url.split("/");
  return `/entities/${encodeURIComponent(type)}/${encodeURIComponent(id)}${suffix}`;
}

function newKey() {
  return window.crypto && crypto.randomUUID
    ? crypto.randomUUID()
    : `${Date.now()}-${Math.random().toString(16).slice(2)}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function showError(error) {
  $("#error").textContent = error ? String(error.message || error) : "";
}

// -- opening an entity -----------------------------------------------------------

async function loadTypes() {
  try {
    const manifest = await api("GET", "/manifest");
    const select = $("#entity-type");
    const current = select.value;
    select.replaceChildren(
      ...manifest.types.map((t) => new Option(t.name, t.name, false, t.name === current)),
    );
    showError(null);
    typesLoaded(manifest.types.map((t) => t.name)); // ops.js: the filters
    refreshEntities();
  } catch (error) {
    showError(error.status === 401 ? new Error("Enter a bearer token to use this gateway.") : error);
  }
}

// Only the Open form (the user typed the id and pressed Open: `create`) or the button of
// a missing entity's prompt creates one: a link (#/type/id, the entity list, a child)
// opens what exists, and for a missing entity asks first, so that a link on another
// page cannot make this console create entities in the user's name.
async function openEntity(type, id, { full = false, create = false } = {}) {
  const url = `/${type}/${id}`;
  showView("entity");
  const problem = urlProblem(type, id);
  if (problem) {
    closeStream();
    ++app.generation;
    return openFailed(app.generation, new Error(problem));
  }
  closeStream();
  clearTimeout(app.refreshTimer); // a refresh of the entity open before must not draw here
  const generation = ++app.generation;
  Object.assign(app, { url, runText: false, sent: loadSent(url) });
  for (const collection of [app.stepBubbles, app.toolCards, app.answering, app.runSources]) {
    collection.clear();
  }
  $("#messages").replaceChildren();
  clearPanels();
  $("#entity-title").textContent = url;
  delete $("#entity-title").dataset.connection; // not connected to this one yet
  $("#entity-type").value = type;
  $("#entity-id").value = id;
  const hash = app.tab === "chat" ? `#${url}` : `#${url}/${app.tab}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
  setComposer(false);
  entityOpening(url);
  try {
    await api("GET", entityPath(url));
  } catch (error) {
    if (error.status !== 404 || error.kind !== "EntityNotFoundError") {
      return openFailed(generation, error); // not a missing entity: an unknown type, ...
    }
    if (!create) return offerCreate(generation, type, id);
    try {
      await api("POST", entityPath(url), {}); // a new entity, as the user asked
    } catch (createError) {
      return openFailed(generation, createError);
    }
  }
  if (generation !== app.generation) return; // another entity was opened meanwhile
  showError(null);
  setComposer(true);
  $("#input").focus();
  follow(url, generation, full);
  refreshPanels();
  refreshEntities();
  showTab(app.tab);
}

function offerCreate(generation, type, id) {
  if (generation !== app.generation) return;
  app.url = null; // nothing is open: no panel refresh may run for it
  showError(null);
  $("#status").innerHTML = "<dt>entity</dt><dd>does not exist</dd>";
  const prompt = document.createElement("div");
  prompt.id = "missing";
  prompt.className = "note";
  prompt.textContent = `No such entity /${type}/${id}. Create it? `;
  const button = document.createElement("button");
  button.id = "create-entity";
  button.type = "button";
  button.textContent = "Create";
  button.addEventListener("click", () => openEntity(type, id, { create: true }));
  prompt.append(button);
  $("#messages").replaceChildren(prompt);
}

// Nothing is open after a failed open: no stale title, no "loading" status.
function openFailed(generation, error) {
  if (generation !== app.generation) return;
  app.url = null; // nothing is open: no panel refresh may run for it
  setComposer(false);
  $("#messages").replaceChildren();
  clearPanels();
  $("#status").innerHTML = "<dt>entity</dt><dd>none open</dd>";
  delete $("#entity-title").dataset.connection;
  $("#entity-title").textContent = "No entity open.";
  document.title = "Wakeful console";
  entityClosed();
  showError(error);
}

// Why `type` and `id` make no entity url (runtime/urls.py's rules), or null.
const TYPE_RE = /^[a-z][a-z0-9_-]{0,63}$/;
const ID_RE = new RegExp(`^(?:${$("#entity-id").getAttribute("pattern")})$`, "v");
function urlProblem(type, id) {
  if (!TYPE_RE.test(type)) return `Not an entity type: ${JSON.stringify(type)}.`;
  const known = [...$("#entity-type").options].map((o) => o.value);
  if (known.length && !known.includes(type)) {
    return `Unknown entity type: ${JSON.stringify(type)} (this gateway serves ${known.join(", ")}).`;
  }
  if (!id) return "Enter an entity id.";
  if (id.length > 200 || !ID_RE.test(id)) {
    return `Not an entity id: ${JSON.stringify(id)} (${$("#entity-id").title}).`;
  }
  return null;
}

function setComposer(enabled) {
  for (const el of ["#input", "#send"]) $(el).disabled = !enabled;
}

function clearPanels() {
  $("#status").innerHTML = "<dt>entity</dt><dd>loading</dd>";
  for (const panel of ["#actions", "#children"]) $(panel).innerHTML = '<p class="muted">none</p>';
  $("#state").innerHTML = '<p class="muted">no collections</p>';
}

// The ids of messages sent from this browser survive a reload, so that a client
// tool call of a run it started is still answered by it (and by no other page).
function loadSent(url) {
  try {
    return new Set(JSON.parse(localStorage.getItem(`wakeful-sent:${url}`) || "[]"));
  } catch {
    return new Set();
  }
}

function rememberSent(url, eventId) {
  app.sent.add(eventId);
  const recent = [...app.sent].slice(-100);
  localStorage.setItem(`wakeful-sent:${url}`, JSON.stringify(recent));
}

function closeStream() {
  if (app.stream) app.stream.abort();
  app.stream = null;
}

// -- the event stream ------------------------------------------------------------

async function follow(url, generation, full) {
  closeStream();
  const controller = new AbortController();
  app.stream = controller;
  let lastEventId = null; // "<log id>|<live id>": where to resume
  let first = true; // the first durable event tells whether the history was cut
  let delay = 250;
  while (!controller.signal.aborted && generation === app.generation) {
    let reader = null;
    try {
      const headers = requestHeaders({ accept: "text/event-stream" });
      if (lastEventId) headers["last-event-id"] = lastEventId;
      const query = lastEventId || full ? "live=1" : `live=1&tail=${HISTORY}`;
      const response = await fetch(entityPath(url, `/events?${query}`), {
        headers,
        signal: controller.signal,
      });
      if (!response.ok) {
        const body = await response.text();
        throw new ApiError(response.status, `event stream of ${url}: ${response.status} ${body}`);
      }
      setConnection("live");
      delay = 250;
      reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (app.stream !== controller) return;
          if (first && !block.includes("event: live")) {
            first = false;
            if (!full && !block.includes("event: created")) earlierHistoryNote(url);
          }
          lastEventId = handleBlock(block) || lastEventId;
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error.status >= 400 && error.status < 500) {
        showError(error); // not going to get better by retrying
        return;
      }
      console.warn("event stream interrupted:", error);
    } finally {
      if (reader) reader.cancel().catch(() => {});
    }
    if (controller.signal.aborted) return;
    setConnection("reconnecting");
    await sleep(delay);
    delay = Math.min(delay * 2, 5000);
  }
}

function earlierHistoryNote(url) {
  const note = document.createElement("div");
  note.className = "note";
  note.id = "earlier";
  const link = document.createElement("a");
  link.textContent = "show the whole history";
  link.addEventListener("click", () => {
    const [, type, id] = url.split("/");
    openEntity(type, id, { full: true });
  });
  note.append(`Only the latest ${HISTORY} events are shown; `, link);
  $("#messages").prepend(note);
}

function setConnection(state) {
  if (!app.url) return;
  $("#entity-title").dataset.connection = state;
  $("#entity-title").textContent = `${app.url} · ${state}`;
  document.title = `${app.url} · Wakeful console`;
}

// Draws one server-sent event; returns its id (the position to resume after).
function handleBlock(block) {
  const fields = {};
  for (const line of block.split("\n")) {
    const colon = line.indexOf(": ");
    if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 2);
  }
  if (!fields.data) return null;
  const { event } = JSON.parse(fields.data);
  if (fields.event === "live") {
    onLive(event);
  } else {
    onDurable(fields.event, event);
    scheduleRefresh();
  }
  return fields.id || null;
}

function onLive(event) {
  if (event.kind === "text") {
    // Deltas carry their step: the next step's first deltas may arrive before the
    // durable text of the step before it.
    const key = `${event.run_id}:${event.step}`;
    let bubble = app.stepBubbles.get(key);
    if (!bubble) {
      bubble = addBubble("agent", "");
      bubble.classList.add("streaming");
      app.stepBubbles.set(key, bubble);
    }
    bubble.querySelector(".text").textContent += event.data;
    bubble.dataset.deltas = String(Number(bubble.dataset.deltas || 0) + 1);
  } else if (event.kind === "tool_data") {
    toolCard(event.tool_call_id).querySelector(".data").textContent = `▤ ${show(event.data)}`;
  } else if (event.kind === "tool_update") {
    const card = toolCard(event.tool_call_id, event.tool);
    card.querySelector(".progress").textContent = show(event.data);
    setToolState(card, "running");
  }
  scrollDown();
}

function onDurable(kind, event) {
  switch (kind) {
    case "msg":
      addBubble("user", show(event.payload), event.sender ? `from ${event.sender}` : null);
      break;
    case "run_started":
      app.runText = false;
      break;
    case "user_turn":
      app.runSources.set(event.run_id, [
        ...(app.runSources.get(event.run_id) || []),
        ...(event.sources || []),
      ]);
      break;
    case "assistant_step":
      onAssistantStep(event);
      break;
    case "tool_intent":
      for (const call of event.calls) setToolState(toolCard(call.id, call.name), "running");
      break;
    case "tool_result": {
      const card = toolCard(event.tool_call_id, event.name);
      card.querySelector(".result").textContent = blocksText(event.content);
      card.querySelector(".progress").textContent = "";
      const denied = card.dataset.decision === "denied";
      setToolState(card, denied ? "denied" : event.is_error ? "error" : "done");
      break;
    }
    case "action_requested": {
      const card = toolCard(event.tool_call_id, event.tool);
      setToolState(card, event.kind === "approval" ? "waiting for approval" : "waiting for the client");
      break;
    }
    case "tool_data": {
      // Public per-call state (the tool's, or a client's for a pending call): the latest wins.
      const card = toolCard(event.tool_call_id);
      card.querySelector(".data").textContent = `▤ ${show(event.data)}`;
      break;
    }
    case "action_settled": {
      const card = toolCard(event.tool_call_id);
      const who = event.by ? ` by ${event.by.user || show(event.by)}` : "";
      card.dataset.decision = event.decision;
      setToolState(card, event.decision === "denied" ? "denied" : `${event.decision}${who}`);
      break;
    }
    case "child_run_finished":
      addNote(`${event.child} ${event.status}${event.error ? `: ${event.error}` : ""}`, event.status !== "completed");
      break;
    case "run_finished":
      finishStreaming(event.run_id);
      // truncated (cut off) and refused runs answered something: show it, then the status
      const answered = ["completed", "truncated", "refused"].includes(event.status);
      if (answered && event.response && !app.runText) {
        addBubble("agent", event.response);
      }
      if (event.status !== "completed") {
        addNote(`run ${event.status}${event.error ? `: ${event.error}` : ""}`, true);
      }
      break;
    case "message_held": {
      const who = event.message.identity ? ` from ${event.message.identity.user || show(event.message.identity)}` : "";
      addNote(`a message${who} waits for the open run of another identity to finish`);
      break;
    }
    case "cancel":
      addNote(`cancel requested: ${event.reason}`);
      break;
    case "handler_error":
      addNote(`handler error (attempt ${event.attempt}): ${event.error_type}: ${event.error}`, true);
      break;
    case "failed":
      addNote(`entity failed after ${event.attempts} attempts: ${event.error}`, true);
      break;
    case "undecodable":
      addNote(`an event could not be decoded: ${event.error}`, true);
      break;
    case "trimmed": // log retention removed the history before this point
      addNote(`earlier history (up to ${event.upto}) was trimmed from Redis by log retention`);
      break;
    default:
      break; // bookkeeping events (state, outbox, timers, ...) show in the side panels
  }
  scrollDown();
}

function onAssistantStep(event) {
  const text = event.content
    .filter((b) => b.type === "text")
    .map((b) => b.text)
    .join("");
  const key = `${event.run_id}:${event.step}`;
  let bubble = app.stepBubbles.get(key);
  if (text) {
    if (!bubble) {
      bubble = addBubble("agent", "");
      app.stepBubbles.set(key, bubble);
    }
    bubble.querySelector(".text").textContent = text; // the durable text is the truth
    app.runText = true;
  }
  if (bubble) bubble.classList.remove("streaming");
  for (const block of event.content) {
    if (block.type !== "tool_use") continue;
    const card = toolCard(block.id, block.name);
    card.querySelector(".input").textContent = show(block.input);
    setToolState(card, "requested");
  }
}

function finishStreaming(runId) {
  for (const [key, bubble] of app.stepBubbles) {
    if (key.startsWith(`${runId}:`)) bubble.classList.remove("streaming");
  }
}

// -- drawing ---------------------------------------------------------------------

function show(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function blocksText(content) {
  if (typeof content === "string") return content;
  return (content || []).map((b) => (b.type === "text" ? b.text : show(b))).join("\n");
}

function addBubble(role, text, from) {
  const bubble = document.createElement("div");
  bubble.className = `bubble ${role}`;
  if (from) {
    const label = document.createElement("span");
    label.className = "from";
    label.textContent = from;
    bubble.append(label);
  }
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  bubble.append(body);
  $("#messages").append(bubble);
  return bubble;
}

function addNote(text, bad = false) {
  const note = document.createElement("div");
  note.className = `note${bad ? " bad" : ""}`;
  note.textContent = text;
  $("#messages").append(note);
}

function toolCard(callId, name) {
  let card = app.toolCards.get(callId);
  if (!card) {
    card = document.createElement("div");
    card.className = "tool";
    card.dataset.call = callId;
    card.innerHTML =
      '<span class="name"></span><span class="state"></span>' +
      '<div class="input json"></div><div class="progress"></div><div class="data"></div>' +
      '<div class="result"></div>';
    $("#messages").append(card);
    app.toolCards.set(callId, card);
  }
  if (name) card.querySelector(".name").textContent = `⚙ ${name}`;
  return card;
}

function setToolState(card, state) {
  const simple = state.split(" ")[0];
  card.dataset.state = ["done", "error", "denied", "running"].includes(simple) ? simple : "waiting";
  card.querySelector(".state").textContent = state;
}

function scrollDown() {
  const box = $("#messages");
  box.scrollTop = box.scrollHeight;
}

// -- side panels -----------------------------------------------------------------

function scheduleRefresh() {
  clearTimeout(app.refreshTimer);
  app.refreshTimer = setTimeout(refreshPanels, 100);
}

async function refreshPanels() {
  const url = app.url;
  if (!url) return;
  const refresh = ++app.refreshes;
  try {
    const [status, actions, children, state] = await Promise.all([
      api("GET", entityPath(url, "/overview")),
      api("GET", entityPath(url, "/actions")),
      api("GET", entityPath(url, "/children")),
      api("GET", entityPath(url, "/state")),
    ]);
    if (url !== app.url || refresh !== app.refreshes) return; // a newer read is drawn
    drawStatus(status);
    drawOverview(status);
    drawActions(actions);
    drawChildren(children);
    drawState(state);
    answerClientTools(actions);
  } catch (error) {
    if (url === app.url) showError(error);
  }
}

function runText(run) {
  if (!run) return "";
  const when = run.at_ms ? ` ${new Date(run.at_ms).toLocaleTimeString()}` : "";
  return `${run.id} ${run.status}${when}`;
}

function drawStatus(status) {
  const rows = [
    ["entity", status.url],
    ["status", status.status], // the server's word, as in the CLI and the client
    ["cursor", status.cursor],
    ["pending actions", status.pending_actions],
    ["awaited children", status.awaited_children],
    ["timers", status.timers],
  ];
  if (status.run) rows.push(["run", runText(status.run)]);
  if (status.last_run) rows.push(["last run", runText(status.last_run)]);
  if (status.lag) rows.push(["lag", lagText(status.lag)]);
  if (status.attempts) rows.push(["attempts", status.attempts]);
  if (status.partition !== undefined) {
    rows.push(["partition", `${status.partition} (${status.served_by || "no live worker"})`]);
  }
  if (status.parent) rows.push(["parent", status.parent]);
  if (status.error) rows.push(["error", status.error]);
  $("#status").replaceChildren(
    ...rows.flatMap(([key, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      if (key === "parent") dd.append(entityLink(value));
      else dd.textContent = show(value);
      if (key === "status") dd.className = `status-${dd.textContent}`;
      return [dt, dd];
    }),
  );
}

function drawActions(actions) {
  const url = app.url; // the buttons answer this entity, whatever is open when clicked
  const box = $("#actions");
  if (!actions.length) {
    box.innerHTML = '<p class="muted">none</p>';
    return;
  }
  box.replaceChildren(
    ...actions.map((action) => {
      const card = document.createElement("div");
      card.className = "action";
      card.dataset.call = action.tool_call_id;
      card.dataset.kind = action.kind;
      card.innerHTML =
        '<div><strong class="tool-name"></strong> <span class="muted kind"></span></div>' +
        '<pre class="input"></pre><div class="buttons"></div>';
      card.querySelector(".tool-name").textContent = action.tool;
      card.querySelector(".kind").textContent =
        (action.kind === "approval" ? "needs your approval" : "waits for the client") +
        (action.refused ? ` (${action.refused})` : "");
      card.querySelector(".input").textContent = JSON.stringify(action.input, null, 1);
      const buttons = card.querySelector(".buttons");
      if (action.kind === "approval") {
        buttons.append(
          button("Approve", "approve", () => answer(url, action, "approve", {})),
          button("Deny", "deny", () =>
            answer(url, action, "deny", { reason: "denied in the console" }),
          ),
          skipButton(url, action),
        );
      } else if (!app.answering.has(action.tool_call_id)) {
        buttons.append(
          button("Fail", "deny", () =>
            answer(url, action, "fail", { error: "failed in the console" }),
          ),
          skipButton(url, action),
        );
      }
      return card;
    }),
  );
}

// Skip: the call is not run; the model gets a synthetic output saying so.
function skipButton(url, action) {
  return button("Skip", "skip", () =>
    answer(url, action, "skip", { reason: "skipped in the console" }),
  );
}

function button(label, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = className;
  b.addEventListener("click", async () => {
    b.disabled = true;
    await onClick();
  });
  return b;
}

// Returns true when the answer was taken, or someone else's answer was (409).
async function answer(url, action, verb, body) {
  const path = entityPath(url, `/actions/${encodeURIComponent(action.tool_call_id)}/${verb}`);
  try {
    await api("POST", path, body);
    showError(null);
    return true;
  } catch (error) {
    showError(error);
    return error.status === 409;
  } finally {
    if (url === app.url) scheduleRefresh();
  }
}

// The browser-side tool: answer each pending getSelectedText call of a run this
// browser started, once (again later if the answer did not get through).
function answerClientTools(actions) {
  const url = app.url;
  for (const action of actions) {
    if (action.kind !== "client" || action.tool !== "getSelectedText") continue;
    const sources = app.runSources.get(action.run_id) || [];
    if (!sources.some((id) => app.sent.has(id)) || app.answering.has(action.tool_call_id)) {
      continue; // a run this browser did not start, or answered already
    }
    app.answering.add(action.tool_call_id);
    answer(url, action, "submit", { output: { text: currentSelection() } }).then((taken) => {
      if (!taken) {
        app.answering.delete(action.tool_call_id);
        if (url === app.url) setTimeout(refreshPanels, 1000); // try again
      }
    });
  }
}

function currentSelection() {
  const selection = window.getSelection();
  const text = selection ? selection.toString() : "";
  if (text && $("#page-text").contains(selection.anchorNode)) return text;
  return app.selection;
}

function drawChildren(children) {
  const box = $("#children");
  if (!children.length) {
    box.innerHTML = '<p class="muted">none</p>';
    return;
  }
  const table = document.createElement("table");
  table.innerHTML = "<tr><th>child</th><th>status</th><th>response</th></tr>";
  for (const child of children) {
    const row = table.insertRow();
    row.insertCell().append(entityLink(child.url));
    const status = row.insertCell();
    status.textContent = child.pending ? "running" : child.status;
    status.className = `status-${status.textContent}`;
    const said = row.insertCell(); // a long answer is cut (all of it in the tooltip)
    said.title = child.response || child.error || "";
    said.textContent = short(said.title, 200);
  }
  box.replaceChildren(table);
}

function drawState(state) {
  const box = $("#state");
  const names = Object.keys(state);
  if (!names.length) {
    box.innerHTML = '<p class="muted">no collections</p>';
    return;
  }
  box.replaceChildren(
    ...names.map((name) => {
      const section = document.createElement("div");
      section.className = "collection";
      section.dataset.collection = name;
      const title = document.createElement("strong");
      title.textContent = `${name} (${state[name].length})`;
      const rows = state[name];
      const columns = [...new Set(rows.flatMap((r) => (r && typeof r === "object" ? Object.keys(r) : [])))];
      const table = document.createElement("table");
      if (columns.length) {
        const head = table.insertRow();
        for (const column of columns) head.insertCell().textContent = column;
        for (const row of rows) {
          const tr = table.insertRow();
          for (const column of columns) tr.insertCell().textContent = show(row[column]);
        }
      } else {
        for (const row of rows) table.insertRow().insertCell().textContent = show(row);
      }
      section.append(title, table);
      return section;
    }),
  );
}

// The sidebar's list: entities of the open entity's type (of the type picked in the form
// while none is open); an answer that comes back after a newer one was asked for is dropped.
async function refreshEntities() {
  const type = app.url ? app.url.split("/")[1] : $("#entity-type").value;
  if (!type) return;
  const listing = ++app.listing;
  try {
    const urls = await api("GET", `/entities/${encodeURIComponent(type)}`);
    if (listing !== app.listing) return;
    $("#entities-heading").textContent = `Entities of type ${type}`;
    $("#entities").replaceChildren(
      ...urls.map((url) => {
        const li = document.createElement("li");
        li.append(entityLink(url));
        return li;
      }),
    );
  } catch (error) {
    showError(error);
  }
}

function entityLink(url) {
  const a = document.createElement("a");
  a.textContent = url;
  a.href = `#${url}`;
  return a;
}

// -- wiring ----------------------------------------------------------------------

async function sendMessage() {
  const text = $("#input").value.trim();
  if (!text || !app.url) return;
  $("#send").disabled = true;
  const url = app.url;
  try {
    const sent = await api(
      "POST",
      entityPath(url, "/messages"),
      { payload: text, client_tools: CLIENT_TOOLS },
      { "idempotency-key": newKey() },
    );
    rememberSent(url, sent.event_id);
    $("#input").value = "";
    showError(null);
  } catch (error) {
    showError(error);
  } finally {
    $("#send").disabled = false;
  }
}

// #/type/id (the chat), #/type/id/journal, #/type/id/tree, #entities?..., #workers.
function openFromHash() {
  const hash = location.hash;
  if (hash.startsWith("#entities")) return showEntities(new URLSearchParams(hash.split("?")[1] || ""));
  if (hash === "#workers") return showWorkers();
  const match = /^#\/([^/]*)\/([^/]*)(?:\/(chat|journal|tree))?$/.exec(hash);
  if (!match) return;
  const [type, id] = [decodeURIComponent(match[1]), decodeURIComponent(match[2])];
  app.tab = match[3] || "chat";
  if (app.url === `/${type}/${id}`) {
    showView("entity");
    return showTab(app.tab);
  }
  openEntity(type, id);
}

// The browser checks the id against its pattern before the form is submitted: say why.
$("#entity-id").addEventListener("invalid", () => {
  showError(new Error(urlProblem($("#entity-type").value, $("#entity-id").value.trim()) || $("#entity-id").validationMessage));
});
$("#open-form").addEventListener("submit", (e) => {
  e.preventDefault();
  openEntity($("#entity-type").value, $("#entity-id").value.trim(), { create: true });
});
$("#composer").addEventListener("submit", (e) => {
  e.preventDefault();
  sendMessage();
});
$("#input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    sendMessage();
  }
});
$("#entity-type").addEventListener("change", () => {
  if (!app.url) refreshEntities(); // with an entity open, the list stays of its type
});
$("#token").addEventListener("change", () => {
  localStorage.setItem("wakeful-token", $("#token").value);
  loadTypes();
});
document.addEventListener("selectionchange", () => {
  const selection = window.getSelection();
  const text = selection ? selection.toString() : "";
  if (text && $("#page-text").contains(selection.anchorNode)) {
    app.selection = text;
    $("#selection").textContent = text;
  }
});
window.addEventListener("hashchange", openFromHash);

// Whether a live worker serves the keyspace (GET /workers, every few seconds): without
// one, messages are stored but nothing handles them, so say so instead of "pending".
const WORKERS_POLL_MS = 5000;
async function checkWorkers() {
  const notice = $("#workers-notice");
  try {
    const info = await api("GET", "/workers");
    if (info.workers.length === 0) {
      notice.textContent =
        "No worker is running: messages are stored but wait until one starts " +
        "(wakeful worker APP, or wakeful serve --worker).";
    } else if (info.unserved.length > 0) {
      notice.textContent =
        `No worker serves partition(s) ${info.unserved.join(", ")} yet ` +
        `(${info.workers.length} live worker(s)).`;
    } else {
      notice.textContent = "";
    }
  } catch {
    notice.textContent = ""; // not allowed or unreachable: the other panels say so
  }
  notice.hidden = notice.textContent === "";
  workersPolled(); // ops.js: the open entity's partition, the workers view
  setTimeout(checkWorkers, WORKERS_POLL_MS);
}

$("#token").value = localStorage.getItem("wakeful-token") || "";
document.addEventListener("DOMContentLoaded", () => {
  loadTypes().then(openFromHash);
  checkWorkers();
});
