// Mooncake dashboards: polls <page>/data.json once a second and renders it. No libraries:
// the charts are small SVG polylines. Everything a service sends is inserted as text
// (textContent), never as HTML, so a segment or client name cannot inject markup.
"use strict";
(function () {
  const INTERVAL_MS = 1000;
  // Token for services started with an auth token: ?token=... on the page URL (kept in
  // sessionStorage and removed from the address bar) is sent as "Authorization: Bearer".
  const params = new URLSearchParams(location.search);
  let token = params.get("token");
  if (token) {
    sessionStorage.setItem("mooncake_token", token);
    params.delete("token");
    const q = params.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : "") + location.hash);
  } else {
    token = sessionStorage.getItem("mooncake_token");
  }
  const dataUrl = location.pathname.replace(/\/+$/, "") + "/data.json";

  // ------------------------------------------------------------------ formatting
  const fmt = {
    bytes(n) {
      if (n == null) return "–";
      const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
      let i = 0;
      while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
      return (i ? n.toFixed(n < 10 ? 2 : 1) : String(Math.round(n))) + " " + u[i];
    },
    num(n) {
      if (n == null) return "–";
      if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(2) + "G";
      if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + "M";
      if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
      return Number.isInteger(n) ? String(n) : n.toFixed(n < 10 ? 2 : 1);
    },
    rate(n) { return n == null ? "–" : fmt.num(n) + "/s"; },
    bps(n) { return n == null ? "–" : fmt.bytes(n) + "/s"; },
    pct(r) { return r == null ? "–" : (100 * r).toFixed(1) + "%"; },
    secs(s) {
      if (s == null) return "–";
      if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
      if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
      return s.toFixed(2) + " s";
    },
    ago(s) { return s == null ? "–" : s < 1 ? "now" : s.toFixed(s < 10 ? 1 : 0) + " s ago"; },
  };

  // ------------------------------------------------------------------ DOM helpers
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null) continue;
      if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
    }
    for (const k of kids.flat()) if (k != null) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function spark(points) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 100 28");
    svg.setAttribute("preserveAspectRatio", "none");
    if (!points || points.length < 2) return svg;
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    let lo = Infinity, hi = -Infinity;
    for (const [, v] of points) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    lo = Math.min(lo, 0);
    const dx = t1 - t0 || 1, dy = hi - lo || 1;
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.map(([t, v]) =>
      ((t - t0) / dx * 100).toFixed(2) + "," + (27 - (v - lo) / dy * 26).toFixed(2)).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "var(--line)");
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    return svg;
  }
  function card(id, label, value, series) {
    return h("div", { class: "card", id: "card-" + id },
      h("div", { class: "k" }, label), h("div", { class: "v", "data-metric": id }, value),
      series === undefined ? null : spark(series));
  }
  function bar(used, cap) {
    const r = cap > 0 ? Math.min(1, used / cap) : 0;
    return h("div", { class: "bar" + (r > 0.9 ? " hot" : ""), title: fmt.pct(r) },
      h("span", { style: "width:" + (100 * r).toFixed(1) + "%" }));
  }
  function table(id, cols, rows, emptyText) {
    if (!rows.length) return h("p", { class: "empty", id }, emptyText);
    return h("div", { class: "scroll" }, h("table", { id },
      h("thead", {}, h("tr", {}, cols.map(c => h("th", { class: c.num ? "num" : null }, c.label)))),
      h("tbody", {}, rows.map(r => h("tr", { "data-key": r._key },
        cols.map(c => h("td", { class: c.num ? "num" : null }, c.cell(r))))))));
  }
  function section(title, ...kids) { return h("section", {}, h("h2", {}, title), ...kids); }
  function pcts(p) { return p ? [fmt.secs(p.p50), fmt.secs(p.p90), fmt.secs(p.p99)].join(" / ") : "–"; }

  // ------------------------------------------------------------------ pages
  function renderMaster(d) {
    const s = d.summary, ha = d.ha, se = d.series;
    const cards = h("div", { class: "cards" },
      card("keys", "keys", fmt.num(s.keys), se.keys),
      card("used", "memory used", fmt.bytes(s.used_bytes) + " / " + fmt.bytes(s.capacity_bytes), se.used_bytes),
      card("put_rate", "puts", fmt.rate(s.put_rate), se.put_rate),
      card("get_rate", "gets", fmt.rate(s.get_rate), se.get_rate),
      card("hit_ratio", "hit ratio (1 min)", fmt.pct(s.hit_ratio)),
      card("hits", "hits / misses", fmt.num(s.hits) + " / " + fmt.num(s.misses)),
      card("evictions", "evictions", fmt.num(s.evictions), se.evictions),
      card("lease_refusals", "lease refusals", fmt.num(s.lease_refusals)),
      card("no_space", "no space (-200)", fmt.num(s.no_space)),
      card("in_flight", "puts in flight", fmt.num(s.puts_in_flight)),
      card("ha", "HA role", ha.enabled ? (ha.leader ? "leader" : "follower") : "single (no HA)"),
      card("epoch", "epoch", String(ha.epoch)),
      card("ssd", "SSD tier", s.offload_enabled
        ? fmt.bytes(s.disk_used_bytes) + (s.disk_quota_bytes ? " / " + fmt.bytes(s.disk_quota_bytes) : "")
        : "off"));
    const segs = table("segments", [
      { label: "segment", cell: r => r.name }, { label: "owner", cell: r => r.owner },
      { label: "host", cell: r => r.host },
      { label: "used", num: true, cell: r => fmt.bytes(r.used) },
      { label: "capacity", num: true, cell: r => fmt.bytes(r.capacity) },
      { label: "usage", cell: r => bar(r.used, r.capacity) },
      { label: "objects", num: true, cell: r => fmt.num(r.objects) },
    ], d.segments.map(r => ({ ...r, _key: r.name })), "no segment mounted yet");
    const clients = table("clients", [
      { label: "client", cell: r => r.id }, { label: "segments", cell: r => r.segments.join(", ") },
      { label: "last heartbeat", num: true, cell: r => fmt.ago(r.last_heartbeat_s) },
    ], d.clients.map(r => ({ ...r, _key: r.id })), "no client connected");
    const rpc = table("rpc", [
      { label: "method", cell: r => r.method }, { label: "calls/s", num: true, cell: r => fmt.rate(r.rate) },
      { label: "p50 / p90 / p99 (1 min)", num: true, cell: r => pcts(r) },
    ], d.rpc.map(r => ({ ...r, _key: r.method })), "no RPC in the last minute");
    const te = table("te", [
      { label: "endpoint", cell: r => r.endpoint }, { label: "transport", cell: r => r.transport },
      { label: "op", cell: r => r.op }, { label: "bytes/s", num: true, cell: r => fmt.bps(r.bytes_per_s) },
      { label: "errors/s", num: true, cell: r => fmt.rate(r.errors_per_s) },
    ], d.te.map(r => ({ ...r, _key: r.endpoint + r.transport + r.op })),
      d.te_note || "no Transfer Engine metrics endpoint configured");
    return [cards, section("Segments", segs), section("Clients", clients),
      section("RPC latency", rpc), section("Transfer Engine", te)];
  }

  function renderProxy(d) {
    const s = d.summary, se = d.series;
    const cards = h("div", { class: "cards" },
      card("req_rate", "requests", fmt.rate(s.req_rate), se.req_rate),
      card("requests", "requests total", fmt.num(s.requests_total)),
      card("ttft", "TTFT p50/p90/p99 (1 min)", pcts(s.ttft), se.ttft_p90),
      card("tbt", "TBT p50/p90/p99 (1 min)", pcts(s.tbt), se.tbt_p90),
      card("rejected", "rejected 429 (SLO)", fmt.num(s.rejected_429), se.rejected_rate),
      card("unavailable", "503 (no instance)", fmt.num(s.rejected_503)),
      card("recomputes", "hand-offs without KV (decode recomputed)", fmt.num(s.decode_recomputes)),
      card("in_flight", "in flight", fmt.num(s.in_flight), se.in_flight),
      card("policy", "policy / hand-off", d.policy + " / " + d.handoff));
    const insts = table("instances", [
      { label: "instance", cell: r => r.id }, { label: "role", cell: r => r.role },
      { label: "health", cell: r => h("span", {}, h("span", { class: "dot " + (r.health === "up" ? "ok" :
        r.health === "down" ? "bad" : "warn") }), " " + r.health) },
      { label: "in flight", num: true, cell: r => fmt.num(r.in_flight) },
      { label: "queue / load", num: true, cell: r => r.role === "prefill"
        ? fmt.num(r.queued_tokens) + " tok" : fmt.num(r.running) + " run" },
      { label: "prefix hit (1 min)", num: true, cell: r => r.role === "prefill" ? fmt.pct(r.prefix_hit_ratio) : "" },
      { label: "req/s", num: true, cell: r => fmt.rate(r.req_rate) },
      { label: "no-KV hand-offs", num: true, cell: r => r.role === "prefill" ? fmt.num(r.recomputes) : "" },
      { label: "last error", cell: r => r.last_error || "" },
    ], d.instances.map(r => ({ ...r, _key: r.id })), "no instance registered");
    return [cards, section("Instances", insts)];
  }

  // ------------------------------------------------------------------ loop
  const main = document.getElementById("main"), statusEl = document.getElementById("status");
  const dot = document.getElementById("dot");
  const render = document.body.dataset.service === "proxy" ? renderProxy : renderMaster;
  let polls = 0;
  async function poll() {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    try {
      const r = await fetch(dataUrl, { headers, cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status + (r.status === 401 || r.status === 403
        ? " (open the page with ?token=YOUR_TOKEN)" : ""));
      const d = await r.json();
      main.replaceChildren(...render(d));
      polls++;
      document.body.dataset.polls = String(polls);
      statusEl.className = "";
      statusEl.textContent = "updated " + new Date().toLocaleTimeString();
      dot.className = "dot ok";
    } catch (e) {
      statusEl.className = "bad";
      statusEl.textContent = "cannot reach the service: " + e.message;
      dot.className = "dot bad";
    }
    setTimeout(poll, INTERVAL_MS);
  }
  poll();
})();
