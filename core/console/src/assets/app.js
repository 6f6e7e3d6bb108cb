// Rill console: a single-page app over the JSON API under /api/.
// Routes (location.hash):
//   #/cluster                      brokers, controller, alive, versions; throughput
//                                  and latency charts of the last 10 minutes
//   #/topics?page=N&internal=1&q=  topics, paged; create a topic
//   #/topics/NAME                  partitions, offsets, configs
//   #/topics/NAME/records?partition=P&offset=O   browse; live tail
//   #/groups, #/groups/ID          consumer groups, lag per partition; reset offsets
//   #/transforms, #/transforms/NAME  state, instances, logs, pause/resume
// With --auth mtls the console signs users in with a token from
// `rill token issue` (kept in an HttpOnly cookie); every page then shows only
// what the user's ACLs allow, and a refused action shows the broker's reason.
"use strict";

const app = document.getElementById("app");
// What the current page runs in the background (refresh timer, live tail),
// stopped when the route changes.
let cleanups = [];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onsubmit" || k === "onchange") e[k] = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Replaces the page's content (null, undefined and false children are left out);
// not while the sign-in form is up.
function show(...children) { if (!signingIn) fill(app, ...children); }

// Whether the console signs users in (`auth`), and who is (`principal`).
let session = { auth: false, principal: null };
let signingIn = false;

async function loadSession() {
  try {
    const r = await fetch("api/session");
    if (r.ok) session = await r.json();
  } catch (e) { /* the page's own request shows the failure */ }
  renderWho();
}

function renderWho() {
  const w = document.getElementById("who");
  if (!session.auth || !session.principal) { w.replaceChildren(); return; }
  w.replaceChildren("Signed in as ", el("b", { id: "principal" }, session.principal), " ",
    el("button", { id: "sign-out", class: "link", onclick: signOut }, "Sign out"));
}

async function signOut() {
  try { await post("signout", {}); } catch (e) { /* signed out either way */ }
  session.principal = null;
  renderWho();
  signInPage(null);
}

// The sign-in form, with why it is needed (`why`: the console's 401 message).
function signInPage(why) {
  for (const c of cleanups) c();
  cleanups = [];
  signingIn = true;
  const token = el("textarea", { id: "token", rows: 4, cols: 90, placeholder: "eyJhbGciOi…", required: true });
  const out = el("div");
  fill(app,
    el("h1", {}, "Sign in"),
    el("p", {}, "The brokers run with ", el("code", {}, "--auth mtls"),
      ": the console acts as you, under the cluster's ACLs. Paste a token made with ",
      el("code", {}, "rill token issue --principal NAME --ttl 1h"), "."),
    why ? el("p", { class: "muted", id: "sign-in-why" }, why) : null,
    el("form", {
      id: "sign-in",
      onsubmit: async ev => {
        ev.preventDefault();
        try {
          const r = await fetch("api/session", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token: token.value }) });
          const body = await r.json();
          if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
          session = body;
          signingIn = false;
          renderWho();
          route();
        } catch (e) { out.replaceChildren(errorBox(e)); }
      },
    }, token, el("div", {}, el("button", { type: "submit", class: "primary" }, "Sign in"))),
    out);
}

function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter(c => c !== null && c !== undefined && c !== false));
}

function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map(h =>
      typeof h === "string" ? el("th", {}, h) : el("th", { class: h.cls }, h.text)))),
    el("tbody", {}, rows));
}

function badge(text, kind) { return el("span", { class: "badge " + kind }, text); }
function enc(s) { return encodeURIComponent(s); }
function fmtTime(ms) {
  if (ms === null || ms === undefined || ms < 0) return "-";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace("Z", " UTC");
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
}
function dash(v) { return v === null || v === undefined ? "-" : String(v); }

async function api(path, options) {
  const resp = await fetch("api/" + path, options);
  let body;
  try { body = await resp.json(); } catch (e) { body = { error: "the console answered " + resp.status + " with no JSON" }; }
  if (resp.status === 401) {
    session.principal = null;
    renderWho();
    signInPage(body.error);
  }
  if (!resp.ok) throw new Error(body.error || ("HTTP " + resp.status));
  return body;
}

function post(path, body) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}) });
}

function errorBox(e) { return el("div", { class: "error", role: "alert" }, String(e.message || e)); }

// Asks the user to confirm `text`; resolves to true on Confirm.
function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise(resolve => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok");
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Renders `render()` now and every `ms` while the route stays.
function every(ms, render) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped) return;
    await render();
    if (!stopped) timer = setTimeout(tick, ms);
  };
  cleanups.push(() => { stopped = true; clearTimeout(timer); });
  return tick();
}

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const parts = path.split("/").filter(p => p !== "").map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

async function route() {
  for (const c of cleanups) c();
  cleanups = [];
  const { parts, params } = parseHash();
  const page = parts[0] || "cluster";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === page);
  }
  if (signingIn) return;
  show(el("p", { class: "muted" }, "Loading…"));
  try {
    if (page === "cluster") await clusterPage();
    else if (page === "topics" && parts.length === 1) await topicsPage(params);
    else if (page === "topics" && parts[2] === "records") await recordsPage(parts[1], params);
    else if (page === "topics") await topicPage(parts[1], params);
    else if (page === "groups" && parts.length === 1) await groupsPage();
    else if (page === "groups") await groupPage(parts[1]);
    else if (page === "transforms" && parts.length === 1) await transformsPage();
    else if (page === "transforms") await transformPage(parts[1]);
    else show(errorBox(new Error("no page " + location.hash)));
  } catch (e) {
    show(errorBox(e));
  }
}

// ---- cluster ----

async function clusterPage() {
  await every(2000, async () => {
    let c;
    try { c = await api("cluster"); } catch (e) { show(el("h1", {}, "Cluster"), errorBox(e)); return; }
    // The charts need describe on the cluster; without it the page still shows the brokers.
    let m = null, mErr = null;
    try { m = await api("metrics"); } catch (e) { mErr = e; }
    document.getElementById("cluster-id").textContent = "cluster " + c.cluster_id;
    const alive = c.brokers.filter(b => b.alive).length;
    const stats = {};
    for (const b of (m ? m.brokers : [])) stats[b.id] = b;
    // A broker's latest point, unless it is stale (the broker stopped answering).
    const last = id => {
      const s = stats[id];
      const p = s && s.points.length ? s.points[s.points.length - 1] : null;
      return p && Date.now() - p.t_ms <= 3 * m.interval_ms ? p : null;
    };
    const rate = v => v === null || v === undefined ? "-" : fmtBytes(v) + "/s";
    show(
      el("h1", {}, "Cluster"),
      el("div", { class: "card summary" },
        el("div", {}, el("b", { id: "broker-count" }, c.brokers.length), "brokers"),
        el("div", {}, el("b", { id: "alive-count" }, alive), "alive"),
        el("div", {}, el("b", {}, dash(c.controller_id)), "controller"),
        el("div", {}, el("b", { class: "muted", style: "font-size:14px" }, c.cluster_id), "cluster id")),
      table(["ID", "Address", "Rack", "Status", "Role", "Version", { text: "Produce in", cls: "num" }, { text: "Consumers out", cls: "num" }],
        c.brokers.map(b => el("tr", { "data-broker-id": b.id, "data-alive": b.alive ? "yes" : "no" },
          el("td", {}, b.id),
          el("td", {}, b.addr),
          el("td", {}, dash(b.rack)),
          el("td", { class: "status" }, b.alive ? badge("alive", "ok") : badge("down", "bad")),
          el("td", {}, b.controller ? badge("controller", "info") : ""),
          el("td", { class: "version" }, stats[b.id] ? stats[b.id].version : "-"),
          el("td", { class: "num" }, b.alive && last(b.id) ? rate(last(b.id).produce_bytes_s) : "-"),
          el("td", { class: "num" }, b.alive && last(b.id) ? rate(last(b.id).fetch_bytes_s) : "-"))),
        { id: "brokers" }),
      el("h2", {}, "Throughput and latency, last " + (m ? Math.round(m.window_s / 60) : 10) + " minutes"),
      mErr ? errorBox(mErr) : el("div", { class: "charts", id: "charts" },
        chart("Produce", "chart-produce", m, p => p.produce_bytes_s, v => fmtBytes(v) + "/s"),
        chart("Fetch by consumers", "chart-fetch", m, p => p.fetch_bytes_s, v => fmtBytes(v) + "/s"),
        chart("Produce latency p99", "chart-produce-p99", m, p => p.produce_p99_ms, v => v.toFixed(1) + " ms"),
        chart("Fetch latency p99 (consumers and followers, long-poll waits included)", "chart-fetch-p99", m, p => p.fetch_p99_ms, v => v.toFixed(1) + " ms")));
  });
}

const COLORS = ["#1f6feb", "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#0a7ea4", "#bf3989", "#57606a"];

// A line per broker of `value(point)` over the metrics window, as inline SVG;
// a broker that did not answer for a while (or a null value) leaves a gap.
function chart(title, id, m, value, fmt) {
  const w = 600, h = 150, left = 4, right = 4, top = 6, bottom = 6;
  const ns = "http://www.w3.org/2000/svg";
  const all = m.brokers.flatMap(b => b.points);
  const now = all.length ? Math.max(...all.map(p => p.t_ms)) : 0;
  // The window, or less while the console has not sampled that long.
  const t0 = all.length ? Math.max(now - m.window_s * 1000, Math.min(...all.map(p => p.t_ms))) : now;
  const values = all.map(value).filter(v => v !== null && v !== undefined);
  const max = values.length ? Math.max(...values) : 0;
  const scale = max > 0 ? max * 1.1 : 1;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "chart-plot");
  const x = t => left + (t - t0) / (now - t0 || 1) * (w - left - right);
  const y = v => h - bottom - v / scale * (h - top - bottom);
  for (let g = 1; g <= 3; g++) {
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", 0); line.setAttribute("x2", w);
    line.setAttribute("y1", y(scale * g / 4)); line.setAttribute("y2", y(scale * g / 4));
    line.setAttribute("class", "grid");
    svg.append(line);
  }
  m.brokers.forEach((b, i) => {
    let seg = [];
    const flush = () => {
      if (seg.length > 1) {
        const pl = document.createElementNS(ns, "polyline");
        pl.setAttribute("points", seg.join(" "));
        pl.setAttribute("stroke", COLORS[i % COLORS.length]);
        pl.setAttribute("data-broker", b.id);
        svg.append(pl);
      }
      seg = [];
    };
    let prev = null;
    for (const p of b.points) {
      const v = value(p);
      if (v === null || v === undefined || (prev && p.t_ms - prev > m.interval_ms * 2.5)) flush();
      if (v !== null && v !== undefined) seg.push(`${x(p.t_ms).toFixed(1)},${y(v).toFixed(1)}`);
      prev = p.t_ms;
    }
    flush();
  });
  return el("div", { class: "card chart", id, "data-max": max },
    el("div", { class: "chart-title" }, el("b", {}, title), " ", el("span", { class: "muted" }, "max " + (values.length ? fmt(max) : "-"))),
    svg,
    el("div", { class: "axis muted" }, el("span", {}, all.length ? new Date(t0).toISOString().slice(11, 19) + " UTC" : ""), el("span", {}, "now")),
    el("div", { class: "legend" }, m.brokers.map((b, i) =>
      el("span", {}, el("i", { style: "background:" + COLORS[i % COLORS.length] }), "broker " + b.id)),
      el("span", { class: "muted" }, values.length ? "" : "no requests yet")));
}

// ---- topics ----

async function topicsPage(params) {
  const page = Number(params.get("page") || 0);
  const internal = params.get("internal") === "1";
  const q = params.get("q") || "";
  const t = await api(`topics?page=${page}&internal=${internal ? 1 : 0}&q=${enc(q)}`);
  const pages = Math.max(1, Math.ceil(t.total / t.per_page));
  const link = (p, inner, qq) => `#/topics?page=${p}&internal=${inner ? 1 : 0}&q=${enc(qq === undefined ? q : qq)}`;
  const search = el("input", { type: "search", placeholder: "filter by name", value: q, id: "topic-filter" });
  const filterForm = el("form", { class: "inline", onsubmit: ev => { ev.preventDefault(); location.hash = link(0, internal, search.value); } },
    el("label", {}, "Name contains", search),
    el("label", {}, "\u00a0", el("button", { type: "submit" }, "Filter")),
    el("label", {}, "\u00a0", el("a", { href: link(0, !internal) }, internal ? "Hide internal topics" : "Show internal topics")));
  const pager = el("div", { class: "pager" },
    page > 0 ? el("a", { href: link(page - 1, internal) }, "← previous") : el("span", { class: "muted" }, "← previous"),
    el("span", {}, `page ${page + 1} of ${pages} (${t.total} topics)`),
    page + 1 < pages ? el("a", { href: link(page + 1, internal) }, "next →") : el("span", { class: "muted" }, "next →"));
  show(
    el("h1", {}, "Topics"),
    filterForm,
    table(["Name", { text: "Partitions", cls: "num" }, { text: "Replication", cls: "num" }, "Health"],
      t.topics.map(x => el("tr", { "data-topic": x.name },
        el("td", {}, el("a", { href: "#/topics/" + enc(x.name) }, x.name), x.internal ? [" ", badge("internal", "info")] : null),
        el("td", { class: "num" }, x.partitions),
        el("td", { class: "num" }, x.replication_factor),
        el("td", {},
          x.offline ? badge(x.offline + " offline", "bad") : null,
          x.under_replicated ? badge(x.under_replicated + " under-replicated", "warn") : null,
          !x.offline && !x.under_replicated ? badge("ok", "ok") : null))),
      { id: "topics" }),
    pager,
    createTopicForm());
}

function createTopicForm() {
  const name = el("input", { name: "name", required: true, placeholder: "orders", id: "new-topic-name" });
  const parts = el("input", { name: "partitions", type: "number", min: 1, placeholder: "default", style: "width:7em" });
  const rf = el("input", { name: "rf", type: "number", min: 1, placeholder: "default", style: "width:7em" });
  const out = el("div");
  const form = el("form", {
    class: "inline", id: "create-topic",
    onsubmit: async ev => {
      ev.preventDefault();
      const what = `Create topic ${name.value} with ${parts.value || "the default number of"} partitions` +
        `${rf.value ? " and replication factor " + rf.value : ""}?`;
      if (!await confirmAction(what)) return;
      try {
        await post("topics", { name: name.value, partitions: parts.value, replication_factor: rf.value });
        out.replaceChildren(el("div", { class: "notice" }, "Created topic ", el("a", { href: "#/topics/" + enc(name.value) }, name.value), "."));
      } catch (e) { out.replaceChildren(errorBox(e)); }
    },
  },
    el("label", {}, "Name", name),
    el("label", {}, "Partitions", parts),
    el("label", {}, "Replication factor", rf),
    el("label", {}, "\u00a0", el("button", { type: "submit", class: "primary" }, "Create topic…")));
  return el("div", {}, el("h2", {}, "Create a topic"), form, out);
}

// Set or remove one config of topic `name`, after a confirmation.
function configForm(name) {
  const key = el("input", { name: "key", required: true, placeholder: "retention.ms", id: "config-key" });
  const value = el("input", { name: "value", placeholder: "empty: back to the default", id: "config-value", style: "width:16em" });
  const out = el("div");
  const form = el("form", {
    class: "inline", id: "alter-config",
    onsubmit: async ev => {
      ev.preventDefault();
      const k = key.value.trim();
      const remove = value.value.trim() === "";
      const text = remove ? `Remove config ${k} from topic ${name} (back to the broker default)?`
        : `Set ${k} = ${value.value.trim()} on topic ${name}?`;
      if (!await confirmAction(text)) return;
      try {
        await post(`topics/${enc(name)}/configs`, remove ? { delete: [k] } : { set: { [k]: value.value.trim() } });
        out.replaceChildren(el("div", { class: "notice" }, remove ? `Removed ${k}.` : `Set ${k} = ${value.value.trim()}.`));
      } catch (e) { out.replaceChildren(errorBox(e)); }
    },
  },
    el("label", {}, "Config", key),
    el("label", {}, "Value", value),
    el("label", {}, "\u00a0", el("button", { type: "submit", class: "primary" }, "Apply…")));
  return el("div", {}, form, out);
}

async function topicPage(name, params) {
  const page = Number(params.get("page") || 0);
  // The refreshed part, and below it the config editor (not redrawn, so what
  // is typed there stays).
  const live = el("div");
  const editor = el("div", {}, el("h2", {}, "Change a config"), configForm(name));
  let shown = false;
  await every(5000, async () => {
    let t;
    try { t = await api(`topics/${enc(name)}?page=${page}`); } catch (e) { show(el("h1", {}, "Topic " + name), errorBox(e)); shown = false; return; }
    if (!shown) { show(live, t.internal ? null : editor); shown = true; }
    const custom = t.configs.filter(c => !c.default);
    const pages = Math.max(1, Math.ceil(t.partition_count / t.per_page));
    const link = p => `#/topics/${enc(name)}?page=${p}`;
    const pager = () => pages === 1 ? null : el("div", { class: "pager" },
      page > 0 ? el("a", { href: link(page - 1) }, "← previous") : el("span", { class: "muted" }, "← previous"),
      el("span", {}, `partitions ${page * t.per_page} to ${Math.min(t.partition_count, (page + 1) * t.per_page) - 1} of ${t.partition_count}`),
      page + 1 < pages ? el("a", { href: link(page + 1) }, "next →") : el("span", { class: "muted" }, "next →"));
    fill(live,
      el("h1", {}, "Topic ", el("span", { id: "topic-name" }, t.name), t.internal ? [" ", badge("internal", "info")] : null),
      el("div", { class: "tabs" },
        el("a", { href: "#/topics/" + enc(name) + "/records" }, "Browse records / live tail →")),
      el("div", { class: "card summary" },
        el("div", {}, el("b", {}, t.partition_count), "partitions"),
        el("div", {}, el("b", {}, t.replication_factor), "replication factor"),
        el("div", {}, el("b", {}, t.under_replicated), "under-replicated"),
        el("div", {}, el("b", {}, t.offline), "offline"),
        el("div", {}, el("b", {}, t.records), "records")),
      el("h2", {}, "Partitions"),
      pager(),
      table(["Partition", "Leader", "Replicas", "In-sync replicas", { text: "Log start", cls: "num" }, { text: "Log end", cls: "num" }, { text: "Local size", cls: "num" }, { text: "Tiered size", cls: "num" }],
        t.partitions.map(p => el("tr", { class: p.under_replicated ? "under" : "", "data-partition": p.partition },
          el("td", {}, el("a", { href: `#/topics/${enc(name)}/records?partition=${p.partition}` }, p.partition)),
          el("td", {}, p.leader === null ? badge("none", "bad") : p.leader),
          el("td", {}, p.replicas.join(", ")),
          el("td", {}, p.isr.join(", "), p.under_replicated ? [" ", badge("under-replicated", "warn")] : null),
          el("td", { class: "num" }, dash(p.log_start_offset)),
          el("td", { class: "num" }, dash(p.log_end_offset)),
          el("td", { class: "num" }, fmtBytes(p.local_bytes)),
          el("td", { class: "num" }, fmtBytes(p.remote_bytes)))),
        { id: "partitions" }),
      pager(),
      el("h2", {}, "Configs ", el("span", { class: "muted", style: "font-weight:normal;font-size:13px" }, `(${custom.length} set on the topic, the rest broker defaults)`)),
      table(["Name", "Value", "Source"], t.configs.map(c => el("tr", {},
        el("td", {}, c.name), el("td", {}, c.value), el("td", {}, c.default ? el("span", { class: "muted" }, "default") : badge("topic", "info"))))));
  });
}

// ---- records ----

function showBytes(b) {
  if (b.kind === "null") return el("span", { class: "muted" }, "null");
  return el("div", {},
    el("pre", {}, b.text),
    b.kind !== "text" || b.truncated ? el("span", { class: "kind" }, b.kind + (b.truncated ? `, first ${b.text.length} of ${b.bytes} bytes` : "")) : null);
}

function recordRow(r) {
  return el("tr", { class: "record", "data-offset": r.offset, "data-partition": r.partition },
    el("td", { class: "num" }, r.partition),
    el("td", { class: "num" }, r.offset),
    el("td", {}, fmtTime(r.timestamp_ms)),
    el("td", {}, showBytes(r.key)),
    el("td", { class: "value" }, showBytes(r.value)),
    el("td", {}, r.headers.length === 0 ? el("span", { class: "muted" }, "-") :
      r.headers.map(h => el("div", {}, el("b", {}, h.key + ": "), showBytes(h.value)))));
}

const recordHeaders = [{ text: "Partition", cls: "num" }, { text: "Offset", cls: "num" }, "Timestamp", "Key", "Value", "Headers"];

async function recordsPage(name, params) {
  const partition = params.get("partition") || "0";
  const offset = params.get("offset") || "";
  const timestamp = params.get("timestamp") || "";
  const data = await api(`topics/${enc(name)}/records?partition=${enc(partition)}&offset=${enc(offset)}&timestamp=${enc(timestamp)}&limit=50`);
  const partSel = el("select", { name: "partition" });
  for (let i = 0; i < data.partitions; i++) {
    partSel.append(el("option", { value: i, selected: String(i) === partition }, i));
  }
  const offInput = el("input", { name: "offset", type: "number", min: 0, value: data.from, style: "width:10em" });
  const timeInput = el("input", { name: "time", type: "datetime-local", step: 1 });
  const base = `#/topics/${enc(name)}/records`;
  const browse = el("form", {
    class: "inline", onsubmit: ev => {
      ev.preventDefault();
      // A time (the browser's zone) wins over the offset.
      const at = timeInput.value ? new Date(timeInput.value).getTime() : NaN;
      location.hash = isNaN(at) ? `${base}?partition=${partSel.value}&offset=${offInput.value}`
        : `${base}?partition=${partSel.value}&timestamp=${at}`;
    },
  },
    el("label", {}, "Partition", partSel),
    el("label", {}, `Offset (${data.log_start_offset} to ${data.log_end_offset})`, offInput),
    el("label", {}, "or from a time", timeInput),
    el("label", {}, "\u00a0", el("button", { type: "submit" }, "Browse")));
  const next = data.next < data.log_end_offset
    ? el("a", { href: `${base}?partition=${partition}&offset=${data.next}` }, "next records →") : el("span", { class: "muted" }, "end of the partition");

  // The live tail: every partition, from the end, by Server-Sent Events.
  const tailBody = el("tbody");
  const tailStatus = el("span", { class: "tail-status", id: "tail-status", "data-state": "off" }, badge("stopped", "warn"));
  let source = null;
  const stopTail = () => { if (source) { source.close(); source = null; } tailStatus.dataset.state = "off"; tailStatus.replaceChildren(badge("stopped", "warn")); tailBtn.textContent = "Start live tail"; };
  const startTail = () => {
    source = new EventSource(`api/topics/${enc(name)}/tail`);
    tailStatus.dataset.state = "connecting";
    tailStatus.replaceChildren(badge("connecting", "info"));
    source.addEventListener("ready", () => { tailStatus.dataset.state = "live"; tailStatus.replaceChildren(badge("live", "ok")); });
    source.addEventListener("failure", ev => { tailStatus.replaceChildren(badge(JSON.parse(ev.data).error, "bad")); });
    source.onmessage = ev => {
      tailBody.prepend(recordRow(JSON.parse(ev.data)));
      while (tailBody.children.length > 500) tailBody.lastChild.remove();
    };
    source.onerror = () => { if (source && source.readyState === EventSource.CLOSED) stopTail(); };
    tailBtn.textContent = "Stop live tail";
  };
  const tailBtn = el("button", { id: "tail-toggle", onclick: () => source ? stopTail() : startTail() }, "Start live tail");
  cleanups.push(() => { if (source) source.close(); });

  show(
    el("h1", {}, "Records of ", el("a", { href: "#/topics/" + enc(name) }, name)),
    el("h2", {}, "Live tail ", tailStatus),
    el("p", { class: "muted" }, "Records produced to any partition from now on, newest first."),
    tailBtn,
    el("table", { class: "records", id: "tail" }, el("thead", {}, el("tr", {}, recordHeaders.map(h => typeof h === "string" ? el("th", {}, h) : el("th", { class: h.cls }, h.text)))), tailBody),
    el("h2", {}, "Browse"),
    browse,
    data.records.length === 0 ? el("p", { class: "muted" }, "No records from this offset.") :
      table(recordHeaders, data.records.map(recordRow), { class: "records", id: "browse" }),
    el("div", { class: "pager" }, next));
  if (params.get("tail") !== "0") startTail();
}

// ---- groups ----

async function groupsPage() {
  await every(3000, async () => {
    let g;
    try { g = await api("groups"); } catch (e) { show(el("h1", {}, "Consumer groups"), errorBox(e)); return; }
    show(
      el("h1", {}, "Consumer groups"),
      g.groups.length === 0 ? el("p", { class: "muted" }, "No consumer groups.") :
        table(["Group", "State", { text: "Members", cls: "num" }], g.groups.map(x => el("tr", { "data-group": x.group_id },
          el("td", {}, el("a", { href: "#/groups/" + enc(x.group_id) }, x.group_id)),
          el("td", {}, x.state),
          el("td", { class: "num" }, x.members))), { id: "groups" }));
  });
}

// A line of `samples` ({t, v}) as an inline SVG, with its range written beside it.
function sparkline(samples) {
  const w = 320, h = 48;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("class", "sparkline");
  if (samples.length > 1) {
    const t0 = samples[0].t, t1 = samples[samples.length - 1].t;
    const max = Math.max(1, ...samples.map(s => s.v));
    const points = samples.map(s =>
      `${((s.t - t0) / Math.max(1, t1 - t0) * (w - 4) + 2).toFixed(1)},${(h - 2 - s.v / max * (h - 4)).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.join(" "));
    svg.append(line);
  }
  return svg;
}

// Moves group `id`'s committed offsets of one topic, after a confirmation;
// then `reload()` redraws the group. `topics(names)` fills the topic choice.
function resetOffsetsForm(id, reload) {
  const topic = el("select", { name: "topic", id: "reset-topic" });
  const to = el("select", { name: "to", id: "reset-to", onchange: () => sync() },
    el("option", { value: "earliest" }, "earliest (the first offset kept)"),
    el("option", { value: "latest" }, "latest (the log end)"),
    el("option", { value: "offset" }, "an offset"),
    el("option", { value: "timestamp" }, "a time (ms since the Unix epoch)"));
  const value = el("input", { name: "value", type: "number", min: 0, step: 1, id: "reset-value", style: "width:13em" });
  const caption = el("span", {}, "Offset");
  const valueLabel = el("label", { id: "reset-value-label" }, caption, value);
  const needsValue = t => t === "offset" || t === "timestamp";
  // The number is asked for only where the target needs one.
  const sync = () => {
    const needed = needsValue(to.value);
    valueLabel.style.display = needed ? "" : "none";
    value.required = needed;
    caption.textContent = to.value === "timestamp" ? "Time (ms since the Unix epoch)" : "Offset";
    value.placeholder = to.value === "timestamp" ? String(Date.now() - 3600000) : "0";
  };
  sync();
  const out = el("div", { id: "reset-result" });
  const form = el("form", {
    class: "inline", id: "reset-offsets",
    onsubmit: async ev => {
      ev.preventDefault();
      const t = topic.value, target = to.value, v = value.value.trim();
      if (!t) {
        out.replaceChildren(errorBox(new Error(`Group ${id} has no partitions of any topic to reset.`)));
        return;
      }
      const where = target === "earliest" ? "the earliest offset still kept"
        : target === "latest" ? "the latest offset (the log end: everything there is now is skipped)"
        : target === "offset" ? `offset ${v} (clamped into what each partition holds)`
        : `the first record at or after ${fmtTime(Number(v))} (${v} ms; the log end where there is none)`;
      const text = `Reset the committed offsets of group ${id} on topic ${t}, every partition, to ${where}? ` +
        "Its consumers will read from there when they start.";
      if (!await confirmAction(text)) return;
      const body = { topic: t, to: target };
      if (needsValue(target)) body.value = v === "" ? null : Number(v);
      try {
        const r = await post(`groups/${enc(id)}/reset-offsets`, body);
        out.replaceChildren(el("div", { class: "notice" }, `Reset group ${id} on topic ${t}: ` +
          r.offsets.map(o => `partition ${o.partition} → offset ${o.offset}`).join(", ") + "."));
      } catch (e) { out.replaceChildren(errorBox(e)); }
      await reload();
    },
  },
    el("label", {}, "Topic", topic),
    el("label", {}, "Reset to", to),
    valueLabel,
    el("label", {}, "\u00a0", el("button", { type: "submit", class: "danger", id: "reset-submit" }, "Reset offsets…")));
  const topics = names => {
    if ([...topic.options].map(o => o.value).join("\n") === names.join("\n")) return;
    const keep = topic.value;
    topic.replaceChildren(...names.map(n => el("option", { value: n }, n)));
    if (names.includes(keep)) topic.value = keep;
  };
  const node = el("div", {},
    el("h2", {}, "Reset committed offsets"),
    el("p", { class: "muted" }, "Moves the group's committed offset of every partition of a topic. " +
      "The broker refuses while the group has members: stop its consumers first."),
    form, out);
  return { node, topics };
}

async function groupPage(id) {
  // Total lag as seen by this page, one sample a refresh, the last 5 minutes.
  const history = [];
  // The refreshed part, and below it the reset form (not redrawn, so what is
  // chosen there stays).
  const live = el("div");
  let shown = false;
  // Only the newest refresh draws (one after a reset may overtake the timer's),
  // and none once the route changed.
  let latest = 0;
  let gone = false;
  cleanups.push(() => { gone = true; });
  const render = async () => {
    const mine = ++latest;
    let g;
    try { g = await api("groups/" + enc(id)); } catch (e) {
      if (mine === latest && !gone) { show(el("h1", {}, "Group " + id), errorBox(e)); shown = false; }
      return;
    }
    if (mine !== latest || gone) return;
    if (!shown) { show(live, reset.node); shown = true; }
    reset.topics([...new Set(g.partitions.map(p => p.topic))].sort());
    history.push({ t: Date.now(), v: g.total_lag });
    while (history.length > 1 && history[0].t < Date.now() - 300000) history.shift();
    const lags = history.map(s => s.v);
    fill(live,
      el("h1", {}, "Group ", g.group_id),
      el("div", { class: "card summary" },
        el("div", {}, el("b", { id: "group-state" }, g.state), "state"),
        el("div", {}, el("b", { id: "member-count" }, g.members.length), "members"),
        el("div", {}, el("b", { id: "total-lag" }, g.total_lag), "total lag"),
        el("div", {}, el("b", {}, g.coordinator), "coordinator"),
        el("div", {}, el("b", {}, g.assignor || "-"), "assignor"),
        el("div", { class: "trend" }, sparkline(history),
          el("span", { class: "muted" }, `lag ${Math.min(...lags)} to ${Math.max(...lags)} over the last ` +
            `${Math.max(1, Math.round((history[history.length - 1].t - history[0].t) / 60000))} min (while this page is open)`))),
      el("h2", {}, "Members"),
      g.members.length === 0 ? el("p", { class: "muted" }, "No members (the group only keeps its committed offsets).") :
        table(["Member", "Client", "Epoch", "Assigned partitions"], g.members.map(m => el("tr", {},
          el("td", {}, m.member_id, m.left ? " (left)" : ""),
          el("td", {}, m.client_id),
          el("td", {}, m.epoch),
          el("td", {}, m.assignment.join(", ") || "-")))),
      el("h2", {}, "Partitions"),
      table(["Topic", { text: "Partition", cls: "num" }, { text: "Committed offset", cls: "num" }, { text: "Log end offset", cls: "num" }, { text: "Lag", cls: "num" }, "Member"],
        g.partitions.map(p => el("tr", { "data-tp": p.topic + "-" + p.partition },
          el("td", {}, el("a", { href: "#/topics/" + enc(p.topic) }, p.topic)),
          el("td", { class: "num" }, p.partition),
          el("td", { class: "num committed" }, dash(p.committed)),
          el("td", { class: "num" }, dash(p.log_end_offset)),
          el("td", { class: "num lag" }, dash(p.lag)),
          el("td", {}, dash(p.member_id)))), { id: "group-partitions" }));
  };
  const reset = resetOffsetsForm(id, render);
  await every(2000, render);
}

// ---- transforms ----

function stateBadge(s) {
  return badge(s, s === "running" ? "ok" : s === "paused" ? "warn" : "bad");
}

async function transformsPage() {
  await every(3000, async () => {
    let t;
    try { t = await api("transforms"); } catch (e) { show(el("h1", {}, "Transforms"), errorBox(e)); return; }
    show(
      el("h1", {}, "Transforms"),
      t.transforms.length === 0 ? el("p", { class: "muted" }, "No transforms deployed (`rill transform deploy`).") :
        table(["Name", "State", "Inputs → outputs", { text: "Instances", cls: "num" }, { text: "Processed", cls: "num" }, { text: "Failed", cls: "num" }, { text: "Lag", cls: "num" }, "Last error"],
          t.transforms.map(x => el("tr", { "data-transform": x.name },
            el("td", {}, el("a", { href: "#/transforms/" + enc(x.name) }, x.name), el("span", { class: "muted" }, " v" + x.version)),
            el("td", {}, stateBadge(x.state)),
            el("td", {}, x.inputs.join(", ") + " → " + x.outputs.join(", ")),
            el("td", { class: "num" }, x.instances),
            el("td", { class: "num" }, x.totals.processed),
            el("td", { class: "num" }, x.totals.failed),
            el("td", { class: "num" }, x.totals.lag),
            el("td", {}, x.last_error ? el("pre", {}, x.last_error) : "-"))), { id: "transforms" }));
  });
}

async function transformPage(name) {
  const out = el("div");
  await every(3000, async () => {
    let t;
    try { t = await api("transforms/" + enc(name)); } catch (e) { show(el("h1", {}, "Transform " + name), errorBox(e)); return; }
    const paused = t.state === "paused";
    const action = paused ? "resume" : "pause";
    const button = el("button", {
      id: "transform-" + action, class: paused ? "primary" : "danger",
      onclick: async () => {
        const text = paused ? `Resume transform ${t.name}? It runs from its committed offsets.`
          : `Pause transform ${t.name}? Its instances stop; offsets and state are kept.`;
        if (!await confirmAction(text)) return;
        try {
          const r = await post(`transforms/${enc(t.name)}/${action}`);
          out.replaceChildren(el("div", { class: "notice" }, `Transform ${r.name} is ${r.state}.`));
        } catch (e) { out.replaceChildren(errorBox(e)); }
      },
    }, paused ? "Resume…" : "Pause…");
    show(
      el("h1", {}, "Transform ", t.name, " ", el("span", { id: "transform-state" }, stateBadge(t.state))),
      out,
      t.halted_reason ? el("div", { class: "error" }, "Halted: " + t.halted_reason) : null,
      el("div", { class: "card summary" },
        el("div", {}, el("b", {}, t.totals.processed), "processed"),
        el("div", {}, el("b", {}, t.totals.failed), "failed"),
        el("div", {}, el("b", {}, t.totals.dead_lettered), "dead-lettered"),
        el("div", {}, el("b", {}, t.totals.lag), "lag"),
        el("div", {}, el("b", {}, "v" + t.version), "version")),
      t.state === "halted" ? null : button,
      el("table", { class: "properties" }, el("tbody", {}, [
        ["Inputs", t.inputs.join(", ")], ["Outputs", t.outputs.join(", ")],
        ["On error", t.dead_letter_topic
          ? [t.on_error + " (to ", el("a", { href: "#/topics/" + enc(t.dead_letter_topic) + "/records" }, t.dead_letter_topic), ")"]
          : t.on_error],
        ["Delivery", t.delivery], ["Runs as", dash(t.runs_as)], ["Group", t.group],
        ["Deployed", fmtTime(t.deployed_at_ms)], ["Module", fmtBytes(t.module_bytes)],
      ].map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))),
      el("h2", {}, "Instances"),
      t.instances.length === 0 ? el("p", { class: "muted" }, "No instance has reported yet.") :
        table(["Instance", "Version", "State", "Partitions", { text: "Processed", cls: "num" }, { text: "Failed", cls: "num" }, { text: "Lag", cls: "num" }, "Last error", "Updated"],
          t.instances.map(s => el("tr", {},
            el("td", {}, s.instance), el("td", {}, "v" + s.version), el("td", {}, stateBadge(s.state)),
            el("td", {}, s.partitions.join(", ") || "-"),
            el("td", { class: "num" }, s.processed), el("td", { class: "num" }, s.failed), el("td", { class: "num" }, s.lag),
            el("td", {}, s.last_error ? el("pre", {}, s.last_error) : "-"),
            el("td", {}, fmtTime(s.updated_ms))))),
      el("h2", {}, "Recent logs"),
      t.logs.length === 0 ? el("p", { class: "muted" }, "No log lines.") :
        table(["Time", "Level", "Instance", "Partition", "Message"], t.logs.slice().reverse().map(l => el("tr", {},
          el("td", {}, fmtTime(l.timestamp_ms)), el("td", {}, l.level), el("td", {}, l.instance),
          el("td", {}, dash(l.partition)), el("td", {}, el("pre", {}, l.message)))), { class: "logs" }));
  });
}

window.addEventListener("hashchange", route);
loadSession().then(() => {
  if (session.auth && !session.principal) signInPage(session.why);
  else route();
});
