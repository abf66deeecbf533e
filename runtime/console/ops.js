// The operator's views of the Wakeful console (loaded after console.js, whose
// helpers it uses: $, api, entityPath, entityLink, show, showError, app).
//
// * Entities (#entities): every entity the caller may read, across types, with its
//   status (the one vocabulary of runtime/status.py) and lag; filtered by status,
//   type and a part of the id, paged by the server (GET /entities).
// * Workers (#workers): live workers, the partitions whose leases each holds, and
//   the partitions none serves (GET /workers).
// * An entity's journal (#/type/id/journal): every event of its log, decoded, with
//   its time; retries, the parked state, trimmed history (GET .../journal).
// * An entity's tree (#/type/id/tree): its children and theirs, with each one's
//   status (GET .../tree).
// * The entity bar's Resume, Cancel run and Delete buttons, each confirmed first.
"use strict";

const VIEWS = ["entity", "entities", "workers"];
const ops = {
  statuses: [], // the status words, as the server lists them
  filter: new URLSearchParams(), // the entities view's query
  next: null, // the entities view's next page (?after=)
  listing: 0, // the latest entities-view read
  journalUrl: null, // the entity whose journal is drawn
  journalNext: null, // where the journal's next page starts (null: at the end)
  journalLast: null, // the last entry drawn (new ones are appended after it)
  journalBusy: false,
  journalIds: new Set(), // the entries drawn (an answer that overlaps another draws each once)
  overview: null, // the open entity's last overview (status, lag, partition, worker)
};

// -- views ----------------------------------------------------------------------

function showView(name) {
  for (const view of VIEWS) $(`#${view}-view`).hidden = view !== name;
  for (const link of ["entities", "workers"]) {
    const a = $(`#nav-${link}`);
    if (link === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function showTab(tab) {
  app.tab = tab;
  for (const name of ["chat", "journal", "tree"]) {
    $(`#${name}-pane`).hidden = name !== tab;
    const a = $(`#tab-${name}`);
    if (name === tab) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!app.url) return;
  const hash = tab === "chat" ? `#${app.url}` : `#${app.url}/${tab}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
  if (tab === "journal") loadJournal(ops.journalUrl !== app.url);
  if (tab === "tree") loadTree();
}

for (const a of document.querySelectorAll("#tabs a")) {
  a.href = "#";
  a.addEventListener("click", (e) => {
    e.preventDefault();
    showTab(a.dataset.tab);
  });
}

// Called by console.js when an entity starts opening, and when nothing is open.
function entityOpening(url) {
  ops.overview = null;
  ops.journalUrl = null;
  $("#journal tbody").replaceChildren();
  $("#tree").innerHTML = '<p class="muted">none</p>';
  $("#journal-parked").hidden = true;
  $("#partition-notice").hidden = true;
  drawButtons(null);
}

function entityClosed() {
  entityOpening(null);
}

// -- the entity bar: resume, cancel, delete -----------------------------------------

// After each read of the open entity (console.js's refreshPanels).
function drawOverview(overview) {
  ops.overview = overview;
  drawButtons(overview);
  const notice = $("#partition-notice");
  if (overview.served_by) {
    notice.hidden = true;
  } else {
    notice.textContent =
      overview.live_workers === 0
        ? `No worker is running: ${overview.url} (partition ${overview.partition}) is not ` +
          "served, and what is sent to it waits until a worker starts (wakeful worker APP)."
        : `No live worker serves partition ${overview.partition}, where ${overview.url} lives ` +
          `(${overview.live_workers} live worker(s) hold other partitions): its inputs wait ` +
          "until one takes the partition's lease.";
    notice.hidden = false;
  }
  if (app.tab === "journal") loadJournal(false);
  if (app.tab === "tree") loadTree();
}

function drawButtons(overview) {
  $("#resume").disabled = !overview || overview.status !== "failed";
  // A run runs (or waits, suspended, for its pending actions): only then is there one to cancel.
  $("#cancel-run").disabled = !overview || !overview.run;
  $("#cancel-run").title = overview && overview.run
    ? `cancel ${overview.run.id} (${overview.run.status})`
    : "no run is running";
  $("#delete").disabled = !overview;
}

// A confirmation in the page (a <dialog>): resolves to true when confirmed. With
// `option`, a checkbox of that text is offered (read it as $("#confirm-check").checked).
function confirmAction(text, confirmLabel, option = null) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-yes").textContent = confirmLabel;
  $("#confirm-option").hidden = !option;
  $("#confirm-option-text").textContent = option || "";
  $("#confirm-check").checked = false;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

async function entityAction(button, question, label, act, option = null) {
  const url = app.url;
  if (!url || !(await confirmAction(question(url), label, option))) return;
  button.disabled = true;
  try {
    const note = await act(url);
    showError(null);
    if (note && url === app.url) addNote(note);
  } catch (error) {
    showError(error);
  } finally {
    if (url === app.url) refreshPanels();
  }
}

$("#resume").addEventListener("click", (e) =>
  entityAction(
    e.currentTarget,
    (url) => `Resume ${url}? Its worker retries the inputs it failed on.`,
    "Resume",
    async (url) => {
      const skip = $("#confirm-check").checked;
      const answer = await api("POST", entityPath(url, "/resume"), { skip_failed: skip });
      return answer.skipped.length
        ? `resumed ${url}, skipping the input(s) it failed on: ${answer.skipped.join(", ")}`
        : `resumed ${url}: its inputs are retried`;
    },
    "skip the inputs it failed on (they are dead-lettered, the rest run)",
  ),
);

$("#cancel-run").addEventListener("click", (e) =>
  entityAction(
    e.currentTarget,
    (url) => `Cancel the current run of ${url}?`,
    "Cancel the run",
    async (url) => {
      await api("POST", entityPath(url, "/cancel"), { reason: "cancelled in the console" });
      return null; // the cancel request shows in the chat from the log
    },
  ),
);

$("#delete").addEventListener("click", (e) =>
  entityAction(
    e.currentTarget,
    (url) => `Delete ${url}? Its log, state and schedules are removed; this cannot be undone.`,
    "Delete",
    async (url) => {
      await api("DELETE", entityPath(url), {});
      if (url === app.url) {
        addNote(`deleting ${url}...`);
        await deleted(url);
      }
      return null;
    },
  ),
);

// Until the entity is gone (its worker deletes it), then say so and close it.
async function deleted(url) {
  for (let wait = 100; url === app.url; wait = Math.min(wait * 2, 2000)) {
    try {
      await api("GET", entityPath(url));
    } catch (error) {
      if (error.status !== 404) throw error;
      if (url !== app.url) return;
      closeStream();
      ++app.generation;
      app.url = null;
      entityClosed();
      setComposer(false);
      $("#status").innerHTML = "<dt>entity</dt><dd>deleted</dd>";
      $("#entity-title").textContent = `${url} was deleted.`;
      delete $("#entity-title").dataset.connection;
      refreshEntities();
      return;
    }
    await sleep(wait);
  }
}

// -- the journal ------------------------------------------------------------------

const BAD_KINDS = new Set(["handler_error", "failed", "undecodable", "delivery_failed", "turn_failed"]);

// Reads the journal of the open entity: from its start when `fresh`, else the entries
// after the last one drawn (a page at a time: "Load more" reads the next).
async function loadJournal(fresh, more = false) {
  const url = app.url;
  if (!url || (ops.journalBusy && !fresh)) return;
  if (!fresh && !more && ops.journalNext) return; // a page is waiting for "Load more"
  ops.journalBusy = true;
  try {
    const after = fresh ? null : more ? ops.journalNext : ops.journalLast;
    const query = after ? `?after=${encodeURIComponent(after)}` : "";
    const journal = await api("GET", entityPath(url, `/journal${query}`));
    if (url !== app.url) return;
    if (fresh || ops.journalUrl !== url) {
      $("#journal tbody").replaceChildren();
      ops.journalUrl = url;
      ops.journalIds.clear();
    }
    for (const entry of journal.entries) {
      if (ops.journalIds.has(entry.id)) continue;
      ops.journalIds.add(entry.id);
      $("#journal tbody").append(journalRow(entry));
    }
    if (journal.entries.length) ops.journalLast = journal.entries.at(-1).id;
    if (journal.next) ops.journalLast = journal.next;
    ops.journalNext = journal.next;
    $("#journal-more").hidden = !journal.next;
    drawParked(journal);
    if (journal.hidden) hiddenNote(journal.hidden);
  } catch (error) {
    if (url === app.url) showError(error);
  } finally {
    ops.journalBusy = false;
  }
}

function drawParked(journal) {
  const box = $("#journal-parked");
  box.hidden = journal.status !== "failed";
  box.textContent =
    `Parked (failed) after ${journal.attempts} attempt(s): ${journal.error || "no error recorded"}. ` +
    "Its inputs wait; Resume retries them.";
}

function hiddenNote(count) {
  const row = document.createElement("tr");
  row.className = "hidden-note";
  const cell = row.insertCell();
  cell.colSpan = 3;
  cell.className = "muted";
  cell.textContent =
    `${count} operator-only entr${count === 1 ? "y" : "ies"} (a bug's full error and ` +
    "traceback) not sent over HTTP: see wakeful tail or rt.runtime_errors(url).";
  $("#journal tbody").append(row);
}

function journalRow(entry) {
  const row = document.createElement("tr");
  row.dataset.kind = entry.kind;
  row.dataset.id = entry.id;
  const event = entry.event || {};
  const bad =
    BAD_KINDS.has(entry.kind) ||
    (entry.kind === "run_finished" && event.status !== "completed") ||
    (entry.kind === "tool_result" && event.is_error);
  if (bad) row.classList.add("bad");
  const time = row.insertCell();
  time.className = "time";
  const at = new Date(entry.at_ms);
  time.textContent = at.toLocaleTimeString([], { hour12: false }) + `.${String(entry.at_ms % 1000).padStart(3, "0")}`;
  time.title = `${at.toISOString()} (entry ${entry.id})`;
  const kind = row.insertCell();
  kind.className = "kind";
  kind.textContent = entry.kind.replace(/_/g, "_\u200b"); // breaks after an underscore only
  const what = row.insertCell();
  what.className = "what";
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = describe(entry);
  const json = document.createElement("pre");
  json.textContent = JSON.stringify(entry.event ?? { error: entry.error }, null, 1);
  details.append(summary, json);
  what.append(details);
  return row;
}

function short(value, limit = 160) {
  const text = show(value).replace(/\s+/g, " ");
  return text.length > limit ? `${text.slice(0, limit - 1)}…` : text;
}

// One line saying what an entry is (its decoded JSON is under it).
function describe(entry) {
  const e = entry.event || {};
  switch (entry.kind) {
    case "trimmed":
      return `history up to ${e.upto} was trimmed from Redis by log retention (an archive hook or wakeful export holds it)`;
    case "undecodable":
      return `cannot be decoded: ${entry.error}`;
    case "created":
      return `created${e.args !== undefined ? ` with args ${short(e.args)}` : ""}`;
    case "msg":
      return `message${e.sender ? ` from ${e.sender}` : ""}: ${short(e.payload)}`;
    case "run_started":
      return `run ${e.run_id} started`;
    case "run_finished":
      return `run ${e.run_id} ${e.status}${e.error ? `: ${e.error}` : e.response ? `: ${short(e.response)}` : ""}`;
    case "assistant_step":
      return `step ${e.step}: ${short((e.content || []).map((b) => (b.type === "text" ? b.text : `[${b.name || b.type}]`)).join(" "))}`;
    case "tool_result":
      return `${e.name} ${e.is_error ? "failed" : "returned"}: ${short(typeof e.content === "string" ? e.content : (e.content || []).map((b) => b.text || show(b)).join(" "))}`;
    case "handler_error":
      return `attempt ${e.attempt} failed: ${e.error_type}: ${e.error}` +
        (entry.traceback_withheld ? " (traceback withheld: wakeful tail shows it)" : "");
    case "failed":
      return `parked after ${e.attempts} attempt(s): ${e.error}`;
    case "resumed":
      return `resumed${e.skipped && e.skipped.length ? `, skipping ${e.skipped.join(", ")}` : ""}`;
    case "cancel":
      return `cancel requested: ${e.reason}`;
    case "child_run_finished":
      return `${e.child} ${e.status}${e.error ? `: ${e.error}` : ""}`;
    case "user_turn":
      return `run ${e.run_id} takes ${(e.sources || []).length} message(s)`;
    case "tool_intent":
      return `calls ${(e.calls || []).map((c) => `${c.name}(${short(c.input, 60)})`).join(", ")}`;
    case "state":
      return (e.ops || []).map((op) => `${op[0]} ${op[1]} ${short(op[2], 40)}`).join("; ");
    case "action_requested":
      return `${e.tool} waits for ${e.kind === "approval" ? "an approval" : "the client"}`;
    case "action_settled":
      return `${e.tool_call_id}: ${e.decision}${e.error ? ` (${e.error})` : ""}`;
    case "outbox":
      return `${(e.effects || []).length} effect(s) sent`;
    case "delivery_failed":
      return `delivery to ${e.target || "?"} failed: ${e.error || short(e)}`;
    default:
      return short(Object.fromEntries(Object.entries(e).filter(([k]) => k !== "t")));
  }
}

$("#journal-more").addEventListener("click", () => loadJournal(false, true));
$("#journal-reload").addEventListener("click", () => loadJournal(true));
$("#journal-errors").addEventListener("change", (e) => {
  $("#journal").classList.toggle("errors-only", e.currentTarget.checked);
});

// -- the tree of children ----------------------------------------------------------

async function loadTree() {
  const url = app.url;
  if (!url) return;
  try {
    const tree = await api("GET", entityPath(url, "/tree"));
    if (url !== app.url) return;
    const root = document.createElement("ul");
    const li = treeNode({ url: tree.url, status: tree.status, run: tree.run });
    li.append(treeList(tree.children));
    root.append(li);
    const box = $("#tree");
    box.replaceChildren(root);
    if (!tree.children.length) box.append(note("no children"));
    if (tree.truncated) box.append(note("deeper or further children are not shown"));
  } catch (error) {
    if (url === app.url) showError(error);
  }
}

function note(text) {
  const p = document.createElement("p");
  p.className = "muted small";
  p.textContent = text;
  return p;
}

function treeList(children) {
  const ul = document.createElement("ul");
  for (const child of children) {
    const li = treeNode(child);
    if (child.children && child.children.length) li.append(treeList(child.children));
    ul.append(li);
  }
  return ul;
}

function treeNode(node) {
  const li = document.createElement("li");
  li.dataset.url = node.url;
  li.append(entityLink(node.url), " ");
  const status = document.createElement("span");
  status.className = `entity-status status-${node.status.replace(/ /g, "-")}`;
  status.textContent = node.status;
  li.append(status);
  const detail = document.createElement("span");
  detail.className = "detail";
  const run = node.run ? `run ${node.run.status}` : "";
  const said = node.run_error || node.error || node.response || "";
  detail.textContent = [run, said ? short(said, 80) : ""].filter(Boolean).join(": ");
  li.append(detail);
  return li;
}

// -- every entity -----------------------------------------------------------------

function typesLoaded(types) {
  const select = $("#filter-type");
  const current = ops.filter.get("type") || select.value;
  select.replaceChildren(new Option("any", ""), ...types.map((t) => new Option(t, t, false, t === current)));
}

function showEntities(query) {
  showView("entities");
  ops.filter = query;
  $("#filter-status").value = query.get("status") || "";
  $("#filter-type").value = query.get("type") || "";
  $("#filter-q").value = query.get("q") || "";
  loadEntities(false);
}

async function loadEntities(more) {
  const listing = ++ops.listing;
  const query = new URLSearchParams(ops.filter);
  if (more && ops.next) query.set("after", ops.next);
  try {
    const page = await api("GET", `/entities?${query}`);
    if (listing !== ops.listing) return; // a newer search is drawn
    if (!ops.statuses.length) {
      ops.statuses = page.statuses;
      $("#filter-status").append(...page.statuses.map((s) => new Option(s, s)));
      $("#filter-status").value = ops.filter.get("status") || "";
    }
    const body = $("#entities-table tbody");
    if (!more) body.replaceChildren();
    for (const row of page.entities) body.append(entityRow(row));
    ops.next = page.next;
    $("#entities-more").hidden = !page.next;
    // One request reads a bounded number of entities: "next" may come with nothing found yet.
    $("#entities-empty").hidden = body.rows.length > 0;
    $("#entities-empty").textContent = page.next
      ? "None found so far: More searches further."
      : "No entity matches.";
    showError(null);
  } catch (error) {
    showError(error.status === 401 ? new Error("Enter a bearer token to use this gateway.") : error);
  }
}

function lagText(lag) {
  if (!lag || !lag.inputs) return "none";
  const age = lag.ms < 1000 ? `${lag.ms} ms` : `${Math.round(lag.ms / 1000)} s`;
  return `${lag.inputs} input(s), oldest ${age}`;
}

function entityRow(row) {
  const tr = document.createElement("tr");
  tr.dataset.url = row.url;
  tr.insertCell().append(entityLink(row.url));
  const status = tr.insertCell();
  status.textContent = row.status;
  status.className = `status-${row.status}`;
  tr.insertCell().textContent = lagText(row.lag);
  tr.insertCell().textContent = row.attempts || "";
  const parent = tr.insertCell();
  if (row.parent) parent.append(entityLink(row.parent));
  tr.insertCell().textContent = row.error || (row.pending_actions ? `${row.pending_actions} pending action(s)` : "");
  return tr;
}

$("#entities-filter").addEventListener("submit", (e) => {
  e.preventDefault();
  const query = new URLSearchParams();
  for (const [name, el] of [["status", "#filter-status"], ["type", "#filter-type"], ["q", "#filter-q"]]) {
    const value = $(el).value.trim();
    if (value) query.set(name, value);
  }
  const hash = `#entities${query.size ? `?${query}` : ""}`;
  if (location.hash === hash) showEntities(query);
  else location.hash = hash;
});
$("#entities-more").addEventListener("click", () => loadEntities(true));

// -- workers ----------------------------------------------------------------------

function showWorkers() {
  showView("workers");
  loadWorkers();
}

async function loadWorkers() {
  try {
    drawWorkers(await api("GET", "/workers"));
  } catch (error) {
    showError(error);
  }
}

function drawWorkers(info) {
  const served = info.partitions - info.unserved.length;
  $("#workers-summary").textContent =
    `${info.workers.length} live worker(s) hold the leases of ${served} of ${info.partitions} partition(s).`;
  $("#workers-table tbody").replaceChildren(
    ...info.workers.map((w) => {
      const tr = document.createElement("tr");
      tr.dataset.worker = w.id;
      tr.insertCell().textContent = w.id;
      tr.insertCell().textContent = w.partitions.length ? w.partitions.join(", ") : "none yet";
      tr.insertCell().textContent = `${(w.last_heartbeat_ms / 1000).toFixed(1)} s ago`;
      tr.insertCell().textContent = `${(w.expires_in_ms / 1000).toFixed(1)} s`;
      return tr;
    }),
  );
  const holders = new Map();
  for (const w of info.workers) for (const p of w.partitions) holders.set(p, w.id);
  const cells = [];
  for (let p = 0; p < info.partitions; p++) {
    const span = document.createElement("span");
    span.dataset.partition = String(p);
    span.textContent = `${p}: ${holders.get(p) || "no live worker"}`;
    if (!holders.has(p)) span.className = "unserved";
    cells.push(span);
  }
  $("#partitions").replaceChildren(...cells);
}

// Called after each poll of GET /workers (console.js's checkWorkers).
function workersPolled() {
  if (!$("#workers-view").hidden) loadWorkers();
  if (app.url && ops.overview) refreshPanels(); // whether its partition is served now
}
