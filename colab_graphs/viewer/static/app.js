// colab-graphs view: one page for audits, runs, studies and training runs. Plain JavaScript, no dependencies.
// The page reads its state from the URL (?path=FOLDER&example=ID&coalition=a,b&member=NAME&step=N, or
// ?a=FOLDER&b=FOLDER to compare two runs or two audits), so every view is a link; it asks the server for JSON
// (/api/log, /api/example, /api/compare) and builds the DOM from it (text is always set as text, never parsed
// as HTML).
"use strict";

const Q = new URLSearchParams(location.search);
const PATH = Q.get("path") || "";
const SVGNS = "http://www.w3.org/2000/svg";

// --- small helpers ---------------------------------------------------------------------------------------------

function build(el, attrs, kids) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}
const h = (tag, attrs, ...kids) => build(document.createElement(tag), attrs, kids);
const s = (tag, attrs, ...kids) => build(document.createElementNS(SVGNS, tag), attrs, kids);

function fmt(v, signed) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const t = Number(v).toFixed(3);
  return signed && !t.startsWith("-") ? "+" + t : t;
}
const fmtCI = (ci) => (ci ? `[${fmt(ci[0])}, ${fmt(ci[1])}]` : "");
const fmtInt = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"));
const fmtCost = (v) => (v === null || v === undefined ? "unknown" : "$" + Number(v).toFixed(4));
// Cost as report.md and the terminal tell it: the calls made, then what the calls served without one cost.
const costText = (spent, made, saved, cached) =>
  `${fmtCost(spent)} for ${fmtInt(made)} call(s) made` +
  (cached ? `; ${fmtInt(cached)} served without a call, which cost ${fmtCost(saved)} when made` : "");
const sign = (v) => (v > 1e-12 ? "pos" : v < -1e-12 ? "neg" : "zero");
const same = (a, b) => a.length === b.length && a.every((m) => b.includes(m));
const label = (members) => (members.length ? members.join(", ") : "∅ (no members)");

function link(params, text, attrs) {
  const q = new URLSearchParams();
  const all = { path: PATH, ...params };
  for (const [k, v] of Object.entries(all)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  return h("a", { href: "?" + q.toString(), ...(attrs || {}) }, text);
}

async function getJSON(url) {
  const response = await fetch(url);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function table(header, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, header.map((c) => (typeof c === "string" ? h("th", {}, c) : c)))),
    h("tbody", {}, rows));
}
const td = (content, attrs) => h("td", attrs || {}, content);
const num = (content, attrs) => h("td", { class: "num", ...(attrs || {}) }, content);
const section = (id, title, ...kids) => h("section", { id }, title ? h("h2", {}, title) : null, ...kids);
const meta = (rows) => h("table", { class: "meta" }, rows.filter((r) => r).map(([k, v]) => h("tr", {}, td(k), td(v))));

function setStatus(d, progress) {
  const el = document.getElementById("status");
  if (d.complete) {
    el.textContent = "finished";
    return;
  }
  el.className = "running";
  if (progress && progress.planned && progress.plays >= progress.planned) el.textContent = "all plays logged";
  else if (progress && progress.planned) el.textContent = `running: ${progress.plays} of ${progress.planned} plays logged (reload to update)`;
  else if (progress) el.textContent = `running: ${progress.plays} logged (reload to update)`;
  else el.textContent = "running (reload to update)";
}

function crumbs() {
  const nav = document.getElementById("crumbs");
  const parts = PATH.split("/").filter((p) => p);
  nav.append(link({ path: "" }, "."));
  parts.forEach((part, i) => {
    nav.append(h("span", { class: "sep" }, "/"), link({ path: parts.slice(0, i + 1).join("/") }, part));
  });
}

// --- conversations ---------------------------------------------------------------------------------------------

function messageText(m) {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content)) return m.content.map((p) => p.text || "").join("\n");
  return JSON.stringify(m.content);
}

function turnCard(t, opts) {
  const o = opts || {};
  const badges = [
    t.cached ? h("span", { class: "badge cached" }, "cache hit") : h("span", { class: "badge made" }, "model call"),
    t.prompt_tokens !== null && t.prompt_tokens !== undefined
      ? h("span", { class: "badge" }, `${fmtInt(t.prompt_tokens)} + ${fmtInt(t.completion_tokens)} tokens`) : null,
    t.cost_usd !== null && t.cost_usd !== undefined ? h("span", { class: "badge" }, fmtCost(t.cost_usd)) : null,
    t.cached || t.latency_s === null || t.latency_s === undefined ? null : h("span", { class: "badge" }, `${Number(t.latency_s).toFixed(2)} s`),
    t.error ? h("span", { class: "badge failed" }, "failed") : null,
    t.policy ? h("span", { class: "badge policy" }, "policy turn") : null,
    t.policy && t.credit !== null && t.credit !== undefined
      ? h("span", { class: "badge " + (t.credit > 0 ? "good" : t.credit < 0 ? "bad" : "") }, `credit ${fmt(t.credit, true)}`)
      : null,
  ];
  const messages = t.messages || [];
  const saw = messages.length
    ? h("details", { class: "saw", open: messages.map(messageText).join("").length < 600 },
        h("summary", {}, `saw ${messages.length} message${messages.length > 1 ? "s" : ""}`),
        messages.map((m) => [h("div", { class: "role" }, m.role), h("pre", {}, messageText(m))]))
    : h("div", { class: "saw" }, "(the prompt was not recorded)");
  const reply = o.diffWith !== undefined && o.diffWith !== null && t.completion !== null
    ? wordDiff(o.diffWith, t.completion || "", o.side)
    : h("pre", {}, t.completion !== null && t.completion !== undefined ? t.completion : t.error ? "error: " + t.error : "(no reply recorded)");
  return h("article", {
    class: ["turn", t.policy ? "policy" : "", o.changed ? "changed" : ""].join(" ").trim(),
    "data-seat": t.seat || "",
  },
    h("header", {}, h("span", { class: "seat" }, t.seat || "?"), " · ", h("span", { class: "member" }, t.member), badges),
    saw,
    h("div", { class: "reply" }, reply));
}

function outcome(play) {
  return h("div", { class: "outcome" },
    "score ", h("b", { class: "score" }, play.failed ? "failed" : fmt(play.score)),
    play.answer !== null && play.answer !== undefined ? [" · answer ", h("code", {}, play.answer)] : null,
    play.error ? h("div", { class: "error" }, play.error) : null);
}

function conversation(play) {
  return h("div", { class: "conversation", "data-coalition": play.members.join(",") },
    outcome(play),
    play.turns.length ? play.turns.map((t) => turnCard(t)) : h("p", { class: "note" }, "No model call (no member plays)."));
}

// Word-level diff of two replies (longest common subsequence); `side` "old" marks deletions, "new" insertions.
function wordDiff(a, b, side) {
  const x = a.split(/(\s+)/), y = b.split(/(\s+)/);
  if (x.length * y.length > 400000) return h("pre", {}, side === "old" ? a : b);
  const L = Array.from({ length: x.length + 1 }, () => new Uint16Array(y.length + 1));
  for (let i = x.length - 1; i >= 0; i--)
    for (let j = y.length - 1; j >= 0; j--)
      L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = h("pre", {});
  let i = 0, j = 0;
  while (i < x.length || j < y.length) {
    if (i < x.length && j < y.length && x[i] === y[j]) { out.append(x[i]); i++; j++; }
    else if (j < y.length && (i >= x.length || L[i][j + 1] >= L[i + 1][j])) { if (side === "new") out.append(h("ins", {}, y[j])); j++; }
    else { if (side === "old") out.append(h("del", {}, x[i])); i++; }
  }
  return out;
}

function seatKeys(turns) {
  const seen = {};
  return turns.map((t) => { const k = t.seat || "?"; seen[k] = (seen[k] || 0) + 1; return `${k}#${seen[k]}`; });
}

function diffView(withM, withoutM, member) {
  // Rows of the grid pair a seat's turn with the member and without it (matched by seat and visit).
  const keysA = seatKeys(withM.turns), keysB = seatKeys(withoutM.turns);
  const byB = Object.fromEntries(keysB.map((k, i) => [k, withoutM.turns[i]]));
  const side = (el, name) => { el.dataset.side = name; return el; };
  const cells = [];
  for (const [i, k] of keysA.entries()) {
    const a = withM.turns[i], b = byB[k];
    const changed = b && (a.completion !== b.completion || JSON.stringify(a.messages) !== JSON.stringify(b.messages));
    cells.push(side(turnCard(a, { changed, diffWith: changed ? b.completion : null, side: "new" }), "with"));
    cells.push(b ? side(turnCard(b, { changed, diffWith: changed ? a.completion : null, side: "old" }), "without")
      : h("div", { class: "turn missing" }, `seat ${a.seat} does not play without ${member}`));
  }
  const inA = new Set(keysA);
  for (const [i, k] of keysB.entries()) {
    if (inA.has(k)) continue;
    cells.push(h("div", { class: "turn missing" }, `seat ${withoutM.turns[i].seat} plays only without ${member}`));
    cells.push(side(turnCard(withoutM.turns[i]), "without"));
  }
  const delta = (withM.score ?? 0) - (withoutM.score ?? 0);
  return h("div", { id: "diff" },
    h("p", {}, `Adding ${member} to {${label(withoutM.members)}} changes the score by `,
      h("b", { class: sign(delta) }, fmt(delta, true)), "; replies that differ are marked, with the words that changed."),
    h("div", { class: "diff" },
      h("h3", { "data-coalition": withM.members.join(",") }, `with ${member}: {${label(withM.members)}}`),
      h("h3", { "data-coalition": withoutM.members.join(",") }, `without ${member}: {${label(withoutM.members)}}`),
      outcome(withM), outcome(withoutM), cells));
}

// --- audits ----------------------------------------------------------------------------------------------------

function sandboxText(sb) {  // a code-scored output's sandbox record (colab_graphs.sandbox.scope)
  const applied = (sb.isolation || []).join(", ") || "none";
  return sb.safe === false ? `${sb.backend} (opted in: the code ran unconfined; applied: ${applied})` : `${sb.backend} (${applied})`;
}

function grandValue(d) {
  const c = d.coalitions.find((c) => same(c.members, d.members));
  return c ? c.value : null;
}

// A report's warnings (colab_graphs.mechanism): a mechanism that found nothing to work on, every time.
const warningsRow = (r) => (r && r.warnings && r.warnings.length
  ? ["Warnings", h("ul", { id: "warnings" }, r.warnings.map((w) => h("li", { class: "error" }, w)))] : null);

function auditMeta(d) {
  const hd = d.header, r = d.report;
  const params = Object.entries(hd.protocol_params || {}).filter(([k]) => !k.endsWith("prompt"));
  return meta([
    ["Members", d.members.join(", ")],
    ["Protocol parameters", params.length ? params.map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ") : "defaults"],
    ["Dataset", hd.dataset || "n/a"],
    ["Scorer", h("span", { id: "scorer" }, hd.scorer || (r && r.scored_by && r.scored_by.length ? `${r.scored_by.join(", ")} (the records' default)` : "from each example"))],
    warningsRow(r),
    r && r.sandbox ? ["Sandbox", h("span", { id: "sandbox" }, sandboxText(r.sandbox))] : null,
    r ? ["Method", `${r.method}${r.shapley_method ? "" : " (leave-one-out only)"}, ${r.coalitions.length} coalitions`] : null,
    ["Examples", r ? `${r.n_examples}${r.failed_examples.length ? ` (${r.failed_examples.length} failed)` : ""}` : String(d.examples.length)],
    ["v(all members)", h("span", { id: "v-all" }, fmt(grandValue(d)))],
    r ? ["Calls", `${fmtInt(r.calls.made)} made, ${fmtInt(r.calls.unique)} distinct, ${fmtInt(r.calls.cached)} cached, ${fmtInt(r.calls.failed)} failed; naive evaluation ${fmtInt(r.calls.naive)}`] : null,
    r ? ["Tokens, cost, time", `${fmtInt(r.tokens.total)} tokens, ${costText(r.cost_usd, r.calls.made, r.cost_saved_usd, r.calls.cached)}, ${Number(r.wall_s).toFixed(1)} s`] : null,
  ]);
}

function membersTable(d) {
  const r = d.report || {}, ci = r.ci || {};
  const measures = [["individual", "Individual", false, d.individual], ["loo", "LOO", true, d.loo]];
  if (d.shapley) measures.push(["shapley", "Shapley", true, d.shapley]);
  const rows = d.members.map((m) => {
    const u = d.usage[m] || {};
    return h("tr", { "data-member": m },
      td(link({ member: m }, m)),
      measures.map(([key, , signed, values]) => num([
        h("span", { class: "v" }, fmt(values[m], signed)),
        h("span", { class: "ci" }, fmtCI((ci[m] || {})[key])),
      ], { "data-measure": key })),
      num(fmtInt(u.calls), { "data-measure": "calls" }),
      num(fmtInt(u.tokens ? u.tokens.total : null), { "data-measure": "tokens" }),
      num(fmtCost(u.cost_usd), { "data-measure": "cost" }));
  });
  const note = d.report ? `Intervals: ${Math.round((r.confidence || 0.95) * 100)}% bootstrap over examples. LOO = v(all) − v(all without the member); Shapley averages the member's marginal contribution over all orders of joining.`
    : "The audit is still being played: individual strengths so far; LOO and Shapley come with the report.";
  return section("members", "Members",
    table(["Member", ...measures.map(([, t]) => h("th", { class: "num" }, t)), h("th", { class: "num" }, "Calls made"), h("th", { class: "num" }, "Tokens"), h("th", { class: "num" }, "Cost")], rows),
    h("p", { class: "note" }, note));
}

function latticeSvg(d, focusMember, selected) {
  const cs = d.coalitions, n = d.members.length;
  if (!cs.length) return h("p", { class: "note" }, "No coalition played yet.");
  if (cs.length > 64) return h("p", { class: "note" }, `${cs.length} coalitions: too many to draw; see the table below.`);
  const idx = Object.fromEntries(d.members.map((m, i) => [m, i]));
  const order = (ms) => [...ms].sort((a, b) => idx[a] - idx[b]);
  const key = (ms) => order(ms).join(",");
  const byKey = Object.fromEntries(cs.map((c) => [key(c.members), c]));
  const levels = Array.from({ length: n + 1 }, () => []);
  for (const c of cs) levels[c.members.length].push(c);
  for (const l of levels) l.sort((a, b) => key(a.members).localeCompare(key(b.members)));
  const wide = Math.max(...levels.map((l) => l.length));
  const nodeW = Math.max(110, 16 + 6.4 * Math.max(...cs.map((c) => c.members.join(",").length)));
  const W = Math.max(480, wide * (nodeW + 12) + 20), gap = 86, H = (n + 1) * gap + 10;
  const pos = {};
  levels.forEach((l, size) => l.forEach((c, i) => { pos[key(c.members)] = [(i + 0.5) * W / l.length, H - 36 - size * gap]; }));
  const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "coalition lattice" });
  for (const c of cs) for (const m of d.members) {
    if (c.members.includes(m)) continue;
    const up = byKey[key([...c.members, m])];
    if (!up) continue;
    const [x1, y1] = pos[key(c.members)], [x2, y2] = pos[key(up.members)];
    const delta = up.value - c.value;
    const cls = focusMember ? (m === focusMember ? "edge " + sign(delta) : "edge faded") : "edge";
    const line = s("line", { x1, y1: y1 - 18, x2, y2: y2 + 18, class: cls, "data-member": m });
    line.append(s("title", {}, `adding ${m} to {${label(c.members)}}: ${fmt(delta, true)}`));
    svg.append(line);
    if (focusMember === m) svg.append(s("text", { x: (x1 + x2) / 2 + 4, y: (y1 + y2) / 2, "font-size": 11, class: sign(delta), fill: delta > 0 ? "#2f855a" : delta < 0 ? "#c53030" : "#4a5568" }, fmt(delta, true)));
  }
  for (const c of cs) {
    const [x, y] = pos[key(c.members)];
    const v = Math.max(0, Math.min(1, c.value ?? 0));
    const dark = v > 0.55;
    const isSel = selected && same(selected, c.members);
    const a = s("a", { href: linkHref({ coalition: c.members.join(",") }), class: "node" + (isSel ? " sel" : ""), "data-coalition": c.members.join(",") },
      s("rect", { x: x - nodeW / 2, y: y - 18, width: nodeW, height: 36, rx: 6, fill: `hsl(210, 65%, ${96 - 52 * v}%)` }),
      s("text", { x, y: y - 3, "text-anchor": "middle", "font-size": 11, fill: dark ? "#fff" : "#1a202c" }, c.members.length ? c.members.join(",") : "∅"),
      s("text", { x, y: y + 12, "text-anchor": "middle", "font-size": 12, "font-weight": 600, fill: dark ? "#fff" : "#1a202c", class: "value" }, fmt(c.value)));
    a.append(s("title", {}, `v({${label(c.members)}}) = ${fmt(c.value)}${c.partial ? ` (partial: ${c.n} examples)` : ""}`));
    svg.append(a);
  }
  return svg;
}

function linkHref(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries({ path: PATH, ...params })) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  return "?" + q.toString();
}

function coalitionsTable(d) {
  const per = Object.fromEntries(((d.report || {}).per_coalition || []).map((c) => [c.members.join(","), c]));
  const rows = d.coalitions.map((c) => {
    const u = per[c.members.join(",")];
    return h("tr", { "data-coalition": c.members.join(",") },
      td(link({ coalition: c.members.join(",") }, label(c.members))),
      num(String(c.members.length)),
      num(h("span", { class: "v" }, fmt(c.value)), { "data-measure": "value" }),
      num(c.partial ? `${c.n} so far` : u ? fmtInt(u.calls) : "–"),
      num(u ? fmtInt(u.tokens.total) : "–"));
  });
  return section("coalitions", "Coalitions",
    h("p", { class: "note" }, "v(S): the mean score of the protocol run with only the members of S. Calls and tokens: what evaluating S alone would take."),
    table(["Coalition", h("th", { class: "num" }, "Size"), h("th", { class: "num" }, "Value"), h("th", { class: "num" }, "Calls"), h("th", { class: "num" }, "Tokens")], rows));
}

function examplesTable(d, coalition) {
  const grand = d.members.join(",");
  const ck = coalition !== null ? coalition : grand;
  const rows = d.examples.map((e) => {
    const sc = e.scores || {};
    const coal = Object.entries(sc).filter(([k]) => !k.startsWith("solo:"));
    const right = coal.filter(([, v]) => v === 1).length;
    return h("tr", { "data-example": e.id },
      td(link({ example: e.id, coalition: coalition }, e.id)),
      td(e.input.length > 140 ? e.input.slice(0, 140) + "…" : e.input),
      td(e.answer !== null && e.answer !== undefined ? h("code", {}, e.answer) : "–"),
      num(fmt(sc[ck])),
      num(coal.length ? `${right} of ${coal.length}` : "–"));
  });
  return section("examples", "Examples",
    table(["Example", "Question", "Gold", h("th", { class: "num" }, coalition !== null ? `{${label(coalition ? coalition.split(",") : [])}}` : "All members"), h("th", { class: "num" }, "Coalitions right")], rows));
}

async function exampleSection(d, id, coalition, member) {
  const ex = await getJSON(`/api/example?path=${encodeURIComponent(PATH)}&id=${encodeURIComponent(id)}`);
  const e = ex.example;
  const game = Q.get("game") || "coalition";
  const plays = ex.plays.filter((p) => p.game === game || (game === "coalition" && p.game === "run"));
  const wanted = coalition !== null ? (coalition ? coalition.split(",") : []) : d.members;
  let selected = plays.find((p) => same(p.members, wanted)) || plays.find((p) => same(p.members, d.members)) || plays[0];
  const sec = h("section", { id: "example", class: "focus" },
    h("h2", {}, "Example ", h("code", {}, id)),
    h("pre", { class: "question" }, e.input || "(input not recorded)"),
    e.answer !== undefined && e.answer !== null ? h("p", {}, "Gold answer: ", h("code", {}, e.answer)) : null);
  if (!ex.plays.length) { sec.append(h("p", { class: "note" }, "Not played yet.")); return sec; }
  const chips = h("div", { class: "chips" });
  for (const p of ex.plays) {
    const cls = "chip" + (p === selected ? " sel" : "") + (p.score === 1 ? " right" : p.score === 0 ? " wrong" : "");
    const name = p.game === "solo" ? `${p.members[0]} alone` : `{${label(p.members)}}`;
    chips.append(link({ example: id, coalition: p.members.join(","), game: p.game === "solo" ? "solo" : null, member }, `${name} ${p.failed ? "failed" : fmt(p.score)}`, { class: cls }));
  }
  sec.append(h("h3", {}, "Plays of this example"), chips);
  if (member && selected && selected.game !== "solo") {
    let withM = selected.members.includes(member) ? selected : plays.find((p) => same(p.members, [...selected.members, member]));
    const withoutM = withM && plays.find((p) => same(p.members, withM.members.filter((m) => m !== member)));
    if (withM && withoutM) { sec.append(diffView(withM, withoutM, member)); return sec; }
    sec.append(h("p", { class: "note" }, `No pair of plays with and without ${member} around this coalition.`));
  }
  sec.append(h("h3", {}, selected.game === "solo" ? `${selected.members[0]} alone` : `{${label(selected.members)}}: the conversation between seats`),
    conversation(selected));
  if (selected.game === "coalition" && d.members.length > 1) {
    const others = d.members.map((m) => link({ example: id, coalition: selected.members.join(","), member: m }, `with / without ${m}`, { class: "chip" }));
    sec.append(h("div", { class: "chips" }, "Compare ", others));
  }
  return sec;
}

function memberSection(d, m) {
  const r = d.report || {}, ci = (r.ci || {})[m] || {};
  const idx = Object.fromEntries(d.members.map((x, i) => [x, i]));
  const key = (ms) => [...ms].sort((a, b) => idx[a] - idx[b]).join(",");
  const byKey = Object.fromEntries(d.coalitions.map((c) => [key(c.members), c]));
  const marginals = d.coalitions.filter((c) => !c.members.includes(m) && byKey[key([...c.members, m])]).map((c) => {
    const up = byKey[key([...c.members, m])];
    return h("tr", {}, td(link({ coalition: up.members.join(","), member: m }, `{${label(c.members)}} + ${m}`)),
      num(fmt(c.value)), num(fmt(up.value)), num(h("span", { class: sign(up.value - c.value) }, fmt(up.value - c.value, true))));
  });
  const without = d.members.filter((x) => x !== m).join(","), all = d.members.join(",");
  const flips = d.examples.filter((e) => e.scores && e.scores[all] !== undefined && e.scores[without] !== undefined && e.scores[all] !== e.scores[without]);
  const u = d.usage[m] || {};
  return h("section", { id: "member", class: "focus" },
    h("h2", {}, "Member ", h("code", {}, m)),
    meta([
      ["Individual (alone)", [h("span", { class: "v" }, fmt(d.individual[m])), h("span", { class: "ci" }, fmtCI(ci.individual))]],
      ["Leave-one-out", [h("span", { class: "v" }, fmt(d.loo[m], true)), h("span", { class: "ci" }, fmtCI(ci.loo))]],
      d.shapley ? ["Shapley", [h("span", { class: "v" }, fmt(d.shapley[m], true)), h("span", { class: "ci" }, fmtCI(ci.shapley))]] : null,
      ["Calls made", `${fmtInt(u.calls)} (${fmtInt(u.tokens ? u.tokens.total : null)} tokens, ${fmtCost(u.cost_usd)})`],
    ]),
    h("h3", {}, `Marginal contributions of ${m} (the lattice's edges that add it)`),
    marginals.length ? table(["Coalition", h("th", { class: "num" }, "v(S)"), h("th", { class: "num" }, `v(S + ${m})`), h("th", { class: "num" }, "Δ")], marginals)
      : h("p", { class: "note" }, "No evaluated pair of coalitions with and without this member."),
    h("h3", {}, `Examples where ${m} changes the full team's score`),
    flips.length ? h("div", { class: "chips" }, flips.map((e) => link({ example: e.id, member: m }, `${e.id}: ${fmt(e.scores[without])} → ${fmt(e.scores[all])}`, { class: "chip " + (e.scores[all] > e.scores[without] ? "right" : "wrong") })))
      : h("p", { class: "note" }, `None: with and without ${m} the full team scores the same on every example${without === all ? "" : " played"}.`));
}

function coalitionSection(d, coalition) {
  const members = coalition ? coalition.split(",") : [];
  const c = d.coalitions.find((x) => same(x.members, members));
  const k = members.join(",");
  const rows = d.examples.filter((e) => e.scores && e.scores[k] !== undefined).map((e) =>
    h("tr", {}, td(link({ example: e.id, coalition: k }, e.id)), td(e.input.slice(0, 120)), num(fmt(e.scores[k]))));
  return h("section", { id: "coalition", class: "focus" },
    h("h2", {}, `Coalition {${label(members)}}`),
    meta([["Value v(S)", h("span", { class: "v" }, c ? fmt(c.value) : "not evaluated")], ["Size", String(members.length)]]),
    rows.length ? table(["Example", "Question", h("th", { class: "num" }, "Score")], rows) : null);
}

function costSection(d) {
  const rows = d.members.map((m) => {
    const u = d.usage[m] || {};
    return h("tr", {}, td(m), num(fmtInt(u.calls)), num(fmtInt(u.tokens ? u.tokens.prompt : null)), num(fmtInt(u.tokens ? u.tokens.completion : null)), num(fmtCost(u.cost_usd)));
  });
  return section("cost", "Calls and cost per member",
    table(["Member", h("th", { class: "num" }, "Calls made"), h("th", { class: "num" }, "Prompt tokens"), h("th", { class: "num" }, "Completion tokens"), h("th", { class: "num" }, "Cost")], rows),
    h("p", { class: "note" }, "Each distinct request counted once: the calls an audit has to make, however many coalitions share them."));
}

async function renderAudit(d) {
  setStatus(d, d.progress);
  const member = Q.get("member"), example = Q.get("example"), coalition = Q.get("coalition");
  const out = [h("h1", {}, "Audit of ", h("code", {}, d.header.protocol || "?")), auditMeta(d)];
  if (!d.complete) out.push(h("p", { class: "note", id: "progress" }, `${d.progress.plays}${d.progress.planned ? " of " + d.progress.planned : ""} plays logged${d.progress.failed ? `, ${d.progress.failed} failed` : ""}. Values below are means over the plays so far.`));
  if (example) out.push(await exampleSection(d, example, coalition, member));
  else if (member) out.push(memberSection(d, member));
  else if (coalition !== null) out.push(coalitionSection(d, coalition));
  out.push(membersTable(d));
  out.push(section("lattice", "Coalition lattice",
    h("p", { class: "note" }, member ? `Edges that add ${member} are coloured by the change in value.` : "Each box is a coalition with its value; an edge adds one member. Pick a member to colour its edges."),
    h("div", { class: "chips" }, d.members.map((m) => link({ member: m }, m, { class: "chip" + (m === member ? " sel" : "") }))),
    latticeSvg(d, member, coalition !== null ? (coalition ? coalition.split(",") : []) : null)));
  out.push(coalitionsTable(d), costSection(d), examplesTable(d, coalition));
  if (d.images && d.images.length) out.push(section("plots", "Plots", d.images.map((name) => h("img", { class: "plot", alt: name, src: `/file?path=${encodeURIComponent(PATH)}&name=${encodeURIComponent(name)}` }))));
  return out;
}

// --- runs ------------------------------------------------------------------------------------------------------

async function renderRun(d) {
  setStatus(d, d.progress);
  const sm = d.summary;
  const out = [h("h1", {}, "Run of ", h("code", {}, d.header.protocol || "?")),
    meta([
      ["Members", (d.members || []).join(", ")],
      ["Score", h("span", { id: "run-score" }, fmt(sm ? sm.score : d.progress.score))],
      ["Examples", sm ? `${sm.n} (${sm.failed} failed)` : `${d.progress.plays}${d.progress.planned ? " of " + d.progress.planned : ""} so far`],
      sm && sm.sandbox ? ["Sandbox", h("span", { id: "sandbox" }, sandboxText(sm.sandbox))] : null,
      warningsRow(sm),
      sm ? ["Calls", `${fmtInt(sm.calls.made)} made, ${fmtInt(sm.calls.cached)} cached, ${fmtInt(sm.calls.failed)} failed`] : null,
      sm ? ["Tokens, cost, time", `${fmtInt(sm.tokens.prompt + sm.tokens.completion)} tokens, ${costText(sm.cost_usd, sm.calls.made, sm.cost_saved_usd, sm.calls.cached)}, ${Number(sm.wall_s).toFixed(1)} s`] : null,
    ])];
  const example = Q.get("example");
  if (example) out.push(await exampleSection({ ...d, members: d.members || [] }, example, null, null));
  const rows = d.examples.map((e) => h("tr", { "data-example": e.id },
    td(link({ example: e.id }, e.id)), td((e.input || "").slice(0, 140)),
    td(e.answer !== undefined && e.answer !== null ? h("code", {}, e.answer) : "–"),
    td(e.system_answer !== undefined && e.system_answer !== null ? h("code", {}, e.system_answer) : "–"),
    num(e.failed ? "failed" : fmt(e.score))));
  out.push(section("examples", "Examples", table(["Example", "Question", "Gold", "Prediction", h("th", { class: "num" }, "Score")], rows)));
  return out;
}

// --- studies ---------------------------------------------------------------------------------------------------

function heatmap(study) {
  const rows = study.correlations;
  const pools = [...new Set(rows.map((r) => r.pool))];
  const fams = [...new Set(rows.filter((r) => r.family !== "all").map((r) => r.family)), "all"].filter((f) => rows.some((r) => r.family === f));
  const cw = 110, ch = 40, left = 110, top = 28;
  const svg = s("svg", { width: left + cw * fams.length + 10, height: top + ch * pools.length + 10, role: "img", "aria-label": "correlation heatmap" });
  fams.forEach((f, j) => svg.append(s("text", { x: left + j * cw + cw / 2, y: 18, "text-anchor": "middle", "font-size": 12, "font-weight": 600 }, f)));
  pools.forEach((p, i) => {
    svg.append(s("text", { x: left - 8, y: top + i * ch + ch / 2 + 4, "text-anchor": "end", "font-size": 12, "font-weight": 600 }, p));
    fams.forEach((f, j) => {
      const r = rows.find((x) => x.pool === p && x.family === f);
      const v = r ? r.spearman : null;
      const fill = v === null || v === undefined ? "#edf2f7" : v >= 0 ? `hsl(210, 70%, ${95 - 45 * v}%)` : `hsl(0, 70%, ${95 + 45 * v}%)`;
      const g = s("g", { class: "cell", "data-pool": p, "data-family": f },
        s("rect", { x: left + j * cw, y: top + i * ch, width: cw - 2, height: ch - 2, fill }),
        s("text", { x: left + j * cw + cw / 2, y: top + i * ch + ch / 2 + 4, "text-anchor": "middle", "font-size": 12, fill: v !== null && Math.abs(v) > 0.6 ? "#fff" : "#1a202c" },
          v === null || v === undefined ? "n/a" : fmt(v, true) + (r.significant ? " *" : "")));
      g.append(s("title", {}, r ? `${p} / ${f}: Spearman ${fmt(v, true)}, p ${r.p_value === null ? "n/a" : Number(r.p_value).toPrecision(3)}, ${r.n_pairs} pairs` : "no pairs"));
      svg.append(g);
    });
  });
  return svg;
}

async function renderStudy(d) {
  const st = d.study;
  setStatus(d, null);
  const out = [h("h1", {}, "Study: individual vs compositional strength")];
  if (st) {
    out.push(meta([
      ["Pools", Object.entries(st.pools).map(([k, v]) => `${k} (${v.join(", ")})`).join("; ")],
      ["Method", `${st.method}; compositional strength = ${st.measure}`],
      ["Calls", `${fmtInt(st.calls.made)} made, ${fmtInt(st.calls.unique)} distinct, ${fmtInt(st.calls.cached)} cached, ${fmtInt(st.calls.failed)} failed`],
      ["Backend", `${st.backend}, ${st.workers} worker(s), ${Number(st.wall_s).toFixed(1)} s`],
      st.sandbox ? ["Sandbox", h("span", { id: "sandbox" }, sandboxText(st.sandbox))] : null,
    ]));
    out.push(section("heatmap", "Rank correlation per pool and protocol family",
      h("p", { class: "note" }, `Spearman's rho between each member's individual strength and its ${st.measure} over (member, protocol, dataset) pairs; * significant at alpha ${st.alpha}.`),
      heatmap(st)));
    const rows = st.correlations.map((c) => h("tr", { "data-pool": c.pool, "data-family": c.family },
      td(c.pool), td(c.family), num(String(c.n_pairs)), num(h("span", { class: "v" }, fmt(c.spearman, true)), { "data-measure": "spearman" }),
      num(fmt(c.kendall, true), { "data-measure": "kendall" }), num(c.p_value === null ? "n/a" : Number(c.p_value).toPrecision(3)),
      td(c.significant === null ? "n/a" : c.significant ? "yes" : "no")));
    out.push(section("correlations", "Correlations", table(["Pool", "Family", h("th", { class: "num" }, "Pairs"), h("th", { class: "num" }, "Spearman"), h("th", { class: "num" }, "Kendall"), h("th", { class: "num" }, "p-value"), "Significant"], rows)));
  } else {
    out.push(h("p", { class: "note" }, "The study is still being played: its audits fill in below; the correlations come with study.json."));
  }
  const measure = st ? st.measure : "loo";
  const rows = d.settings.map((x) => {
    const r = x.result;
    const comp = r ? (measure === "shapley" ? r.shapley : r.loo) || {} : {};
    const status = x.status !== "playing" ? x.status
      : x.planned && x.plays >= x.planned ? "all plays logged" : `playing ${x.plays}${x.planned ? " of " + x.planned : ""}`;
    return h("tr", { "data-setting": x.key },
      td(x.pool), td(x.protocol || "solo"), td(x.family || "–"), td(x.dataset),
      num(r ? fmt(r.v_all) : "–"),
      td(r ? (r.error ? r.error : r.members.map((m) => `${m} ${fmt(r.individual[m])}/${fmt(comp[m], true)}`).join(", ")) : "–"),
      td(link({ path: x.path }, x.kind === "solo" ? "solo plays" : "audit")), td(status));
  });
  out.push(section("settings", "Settings", table(["Pool", "Protocol", "Family", "Dataset", h("th", { class: "num" }, "v(all)"), `member individual/${measure}`, "Folder", "Status"], rows)));
  return out;
}

// --- training runs ---------------------------------------------------------------------------------------------

function lineChart(title, points) {
  const W = 300, H = 160, L = 56, B = 24, T = 18, R = 10;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (x) => L + (x1 === x0 ? (W - L - R) / 2 : ((x - x0) / (x1 - x0)) * (W - L - R));
  const sy = (y) => H - B - (y1 === y0 ? (H - B - T) / 2 : ((y - y0) / (y1 - y0)) * (H - B - T));
  const svg = s("svg", { width: W, height: H, role: "img", "aria-label": title },
    s("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
    s("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
    s("text", { x: L - 4, y: T + 4, "text-anchor": "end", "font-size": 10 }, y1.toPrecision(3)),
    s("text", { x: L - 4, y: H - B, "text-anchor": "end", "font-size": 10 }, y0.toPrecision(3)),
    s("text", { x: L, y: H - 8, "font-size": 10 }, `step ${x0}`),
    s("text", { x: W - R, y: H - 8, "text-anchor": "end", "font-size": 10 }, `step ${x1}`),
    s("polyline", { class: "line", points: points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ") }),
    points.map(([x, y]) => s("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: "#2b6cb0" }, s("title", {}, `step ${x}: ${y}`))));
  return h("div", { class: "chart", "data-metric": title }, h("div", { class: "title" }, title), svg);
}

const CURVES = ["system_reward", "loss", "reward_std", "policy_correct", "advantage_mean", "advantage_abs_max", "policy_tokens", "system_tokens", "grad_norm", "segments", "step_time"];

async function renderTrain(d) {
  setStatus(d, null);
  const hd = d.header, sm = d.summary || {};
  const out = [h("h1", {}, "Training run: ", h("code", {}, hd.protocol || "?")),
    meta([
      ["Reward", hd.reward || "–"], ["Credit", hd.credit || "–"], ["Policy member", hd.policy_member || "–"],
      ["Steps logged", String(d.steps.length)], sm.wall_s ? ["Wall time", `${Number(sm.wall_s).toFixed(1)} s`] : null,
      sm.sandbox ? ["Sandbox", h("span", { id: "sandbox" }, sandboxText(sm.sandbox))] : null,
    ])];
  const ev = d.evaluations;
  if (Object.keys(ev).length) {
    const names = [["system", "System score v(N)"], ["without_policy", "Without the policy v(N \\ policy)"], ["loo", "Policy seat's LOO"], ["policy_solo", "Policy alone"]];
    const rows = names.map(([k, t]) => h("tr", { "data-measure": k }, td(t),
      num(h("span", { class: "v before" }, ev.before ? fmt(ev.before[k], k === "loo") : "–")),
      num(h("span", { class: "v after" }, ev.after ? fmt(ev.after[k], k === "loo") : "–")),
      num(ev.before && ev.after ? h("span", { class: sign(ev.after[k] - ev.before[k]) }, fmt(ev.after[k] - ev.before[k], true)) : "–")));
    out.push(section("evaluation", "Held-out evaluation, before and after training",
      table(["", h("th", { class: "num" }, "Before"), h("th", { class: "num" }, "After"), h("th", { class: "num" }, "Change")], rows),
      h("p", { class: "note" }, `${(ev.after || ev.before).n} held-out examples.`)));
  }
  const charts = CURVES.filter((k) => d.steps.some((st) => typeof st[k] === "number"))
    .map((k) => lineChart(k, d.steps.filter((st) => typeof st[k] === "number").map((st) => [st.step, st[k]])));
  out.push(section("curves", "Learning curves", charts.length ? h("div", { class: "charts" }, charts) : h("p", { class: "note" }, "No step logged yet.")));
  const steps = [...new Set(d.rollouts.map((r) => r.step))];
  const step = Q.get("step") !== null ? Number(Q.get("step")) : steps[steps.length - 1];
  const shown = d.rollouts.filter((r) => r.step === step);
  out.push(section("rollouts", "Sample rollouts",
    steps.length ? h("div", { class: "chips" }, "Step ", steps.map((x) => link({ step: x }, String(x), { class: "chip" + (x === step ? " sel" : "") }))) : h("p", { class: "note" }, "No rollout logged (rollouts.jsonl is written by training runs of this version)."),
    shown.map((r, i) => h("div", { class: "rollout", "data-example": r.example },
      h("h3", {}, `Rollout ${i + 1} on `, h("code", {}, r.example), ` · reward ${fmt(r.reward)}`, r.policy_score !== null && r.policy_score !== undefined ? ` · policy alone ${fmt(r.policy_score)}` : ""),
      h("div", { class: "conversation" }, r.turns.map((t) => turnCard({ ...t, prompt_tokens: null, completion_tokens: null, latency_s: null }, {})))))));
  return out;
}

// --- a folder of outputs ---------------------------------------------------------------------------------------

async function renderIndex(d) {
  document.getElementById("status").textContent = "";
  const rows = d.outputs.map((o) => h("tr", {}, td(link({ path: o.path }, o.path)), td(o.kind)));
  return [h("h1", {}, "Outputs under ", h("code", {}, d.path || ".")),
    rows.length ? table(["Folder", "Kind"], rows) : h("p", { class: "note" }, "No colab-graphs output (run, audit, study, training run) in this folder."),
    compareForm(d.outputs)];
}

// --- compare ---------------------------------------------------------------------------------------------------

function delta(x, y) {
  return x === null || x === undefined || y === null || y === undefined ? null : y - x;
}

function renderCompare(d) {
  const a = d.a, b = d.b;
  const side = (x) => link({ path: x.path, a: null, b: null }, x.path);
  const row = (name, x, y, show, signed, id) => h("tr", id ? { id } : {},
    td(name), num(show(x)), num(show(y)),
    num(h("b", { class: sign(delta(x, y) || 0) }, typeof x === "number" && typeof y === "number" ? (show === fmtInt ? (y - x >= 0 ? "+" : "") + fmtInt(y - x) : show === fmtCost ? fmtCost(y - x) : fmt(y - x, true)) : "–")));
  const score = d.kind === "run" ? "Score" : "v(all members)";
  const out = [
    h("h1", {}, `Compare ${d.kind}s`),
    meta([["A", side(a)], ["B", side(b)], ["Protocols", `${a.protocol || "?"} · ${b.protocol || "?"}`], ["Data", `${a.dataset || "n/a"} · ${b.dataset || "n/a"}`]]),
    section("compare-summary", "Side by side",
      table(["", h("th", { class: "num" }, "A"), h("th", { class: "num" }, "B"), h("th", { class: "num" }, "B − A")], [
        row(score, a.score, b.score, fmt, false, "compare-score"),
        row("Examples", a.n_examples, b.n_examples, fmtInt),
        row("Failed examples", a.failed, b.failed, fmtInt),
        row("Calls made", a.calls.made, b.calls.made, fmtInt, false, "compare-calls"),
        row("Calls cached", a.calls.cached, b.calls.cached, fmtInt),
        row("Calls failed", a.calls.failed, b.calls.failed, fmtInt),
        row("Cost", a.cost_usd, b.cost_usd, fmtCost),
      ])),
  ];
  if (d.notes.length) out.push(h("ul", { class: "note", id: "compare-notes" }, d.notes.map((n) => h("li", {}, n))));
  if (d.members.length) {
    const measures = [["individual", "Individual", false], ["loo", "LOO", true], ["shapley", "Shapley", true], ["calls", "Calls made", false]];
    const head = ["Member", ...measures.flatMap(([, t]) => [h("th", { class: "num" }, `${t} A`), h("th", { class: "num" }, `${t} B`), h("th", { class: "num" }, "Δ")])];
    const rows = d.members.map((r) => h("tr", { "data-member": r.member }, td(r.member),
      measures.flatMap(([k, , signed]) => [
        num(k === "calls" ? fmtInt(r.a[k]) : fmt(r.a[k], signed), { "data-measure": `${k}-a` }),
        num(k === "calls" ? fmtInt(r.b[k]) : fmt(r.b[k], signed), { "data-measure": `${k}-b` }),
        num(h("b", { class: sign(r.delta[k] || 0) }, k === "calls" ? fmtInt(r.delta[k]) : fmt(r.delta[k], true)), { "data-measure": `${k}-delta` }),
      ])));
    out.push(section("compare-members", "Members", table(head, rows)));
  }
  const outcomeText = (o) => (o.failed ? "failed" : fmt(o.score)) + (o.prediction !== null && o.prediction !== undefined ? ` (${o.prediction})` : "");
  const changed = d.changed.map((c) => h("tr", { "data-example": c.id },
    td(link({ path: a.path, a: null, b: null, example: c.id }, c.id)), td((c.input || "").slice(0, 120)),
    td(c.gold !== null && c.gold !== undefined ? h("code", {}, c.gold) : "–"),
    num(outcomeText(c.a)), num(outcomeText(c.b))));
  const others = [d.only_in_a.length ? `${d.only_in_a.length} only in A` : null, d.only_in_b.length ? `${d.only_in_b.length} only in B` : null].filter((x) => x);
  out.push(section("compare-changed", `Examples that changed (${d.changed.length} of ${d.shared_examples} shared${others.length ? "; " + others.join(", ") : ""})`,
    changed.length ? table(["Example", "Question", "Gold", h("th", { class: "num" }, "A (prediction)"), h("th", { class: "num" }, "B (prediction)")], changed)
      : h("p", { class: "note" }, "No shared example changed score.")));
  return out;
}

function compareForm(outputs) {
  // Two outputs of one kind (runs or audits) to compare: the form goes to ?a=...&b=...
  const options = outputs.filter((o) => o.kind === "run" || o.kind === "audit");
  if (options.length < 2) return null;
  const select = (name, chosen) => h("select", { name, id: `compare-${name}` },
    options.map((o, i) => h("option", { value: o.path, selected: i === chosen }, `${o.path} (${o.kind})`)));
  return section("compare", "Compare two runs or two audits",
    h("form", { method: "get", action: "" }, "A ", select("a", 0), " B ", select("b", 1), " ", h("button", { type: "submit" }, "Compare")));
}

// --- main ------------------------------------------------------------------------------------------------------

async function main() {
  crumbs();
  const app = document.getElementById("app");
  try {
    if (Q.get("a") !== null && Q.get("b") !== null) {
      const d = await getJSON(`/api/compare?a=${encodeURIComponent(Q.get("a"))}&b=${encodeURIComponent(Q.get("b"))}`);
      document.title = `compare ${Q.get("a")} with ${Q.get("b")} · colab-graphs view`;
      document.getElementById("status").textContent = d.a.complete && d.b.complete ? "finished" : "running (reload to update)";
      app.replaceChildren(...renderCompare(d));
      document.body.dataset.ready = "1";
      return;
    }
    const d = await getJSON(`/api/log?path=${encodeURIComponent(PATH)}`);
    const render = { audit: renderAudit, run: renderRun, study: renderStudy, train: renderTrain, index: renderIndex }[d.kind];
    document.title = `${d.kind} ${PATH || "."} · colab-graphs view`;
    app.replaceChildren(...(await render(d)));
  } catch (err) {
    app.replaceChildren(h("div", { class: "error", id: "error" }, String(err.message || err)));
  }
  document.body.dataset.ready = "1";
}

main();
