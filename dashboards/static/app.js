// cmdare pages: one script for every page (its name is <main data-page>). It reads the
// collector's HTTP API (same origin) or, in a self-contained report, window.CMDARE_DATA.
// Data is only ever inserted as text (textContent), never as HTML.
"use strict";
(function () {
  const RANGES = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800, "all": 0 };
  const REPORT = typeof window.CMDARE_DATA === "object" && window.CMDARE_DATA !== null;
  const main = document.getElementById("page");
  const params = new URLSearchParams(location.search);
  const state = {
    range: RANGES[params.get("range")] !== undefined ? params.get("range") : (REPORT ? "all" : "1h"),
    refresh: ["0", "10", "30", "60"].includes(params.get("refresh")) ? params.get("refresh") : "0",
  };
  let timer = null;

  // -- helpers -------------------------------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "";
    if (typeof v === "object" && v.$float) return v.$float;
    if (typeof v === "number") {
      if (Number.isInteger(v)) return v.toLocaleString("en");
      return v.toLocaleString("en", { maximumFractionDigits: digits === undefined ? 3 : digits });
    }
    if (typeof v === "object") return JSON.stringify(v);
    const iso = ISO.exec(v);  // a time: to the second, as the other tables print it (no T, no microseconds)
    return iso ? `${iso[1]} ${iso[2]}${iso[3] && iso[3] !== "Z" && !/^[+-]00:?00$/.test(iso[3]) ? iso[3] : ""}` : String(v);
  }
  const ISO = /^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?$/;
  function since() {
    const s = RANGES[state.range];
    return s ? new Date(Date.now() - s * 1000).toISOString().slice(0, 19) + "Z" : null;
  }
  function url(path, q) {
    const u = new URLSearchParams();
    for (const [k, v] of Object.entries(q || {})) if (v !== null && v !== undefined && v !== "") u.set(k, v);
    const s = u.toString();
    return path + (s ? "?" + s : "");
  }
  async function get(path, q) {
    if (REPORT) {  // the report holds the answers under the path alone (its window is fixed)
      const d = window.CMDARE_DATA[path];
      if (d === undefined) throw new Error("not in this report: " + path);
      if (d && d.error) throw new Error(d.error);
      return d;
    }
    const r = await fetch(url(path, q), { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.redirected && r.url.includes("/ui/login")) { location.href = r.url; throw new Error("signed out"); }
    let body;
    try { body = await r.json(); } catch (e) { throw new Error(path + ": HTTP " + r.status); }
    if (!r.ok) throw new Error(body && body.error ? body.error : path + ": HTTP " + r.status);
    return body;
  }
  function rowsOf(t) { return t.rows.map((r) => Object.fromEntries(t.columns.map((c, i) => [c, r[i]]))); }
  function showError(e) {
    const box = document.getElementById("error");
    box.hidden = false;
    box.textContent = String(e && e.message ? e.message : e);
  }
  function section(title, ...kids) { return el("section", {}, el("h2", { text: title }), ...kids); }
  const MAX_TABLE_ROWS = 1000;  // rows a table draws (all of them sort and filter)
  function table(columns, rows, opts) {
    opts = opts || {};
    const wrap = el("div", { class: "tablewrap" });
    const t = el("table", {});
    const head = el("tr", {});
    let sortKey = null, desc = false;
    const body = el("tbody", {});
    const filter = opts.filter ? el("input", { class: "filter", placeholder: "filter rows", type: "search" }) : null;
    function render() {
      body.textContent = "";
      let rs = rows;
      const f = filter && filter.value.trim().toLowerCase();
      if (f) rs = rs.filter((r) => columns.some((c) => fmt(r[c]).toLowerCase().includes(f)));
      if (sortKey) {
        rs = rs.slice().sort((a, b) => {
          const x = a[sortKey], y = b[sortKey];
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * (desc ? -1 : 1);
        });
      }
      for (const r of rs.slice(0, MAX_TABLE_ROWS)) {
        const tr = el("tr", opts.highlight && opts.highlight(r) ? { class: "hl" } : {});
        for (const c of columns) {
          const v = r[c];
          const td = el("td", typeof v === "number" ? { class: "num" } : {});
          const link = opts.links && opts.links[c] && v !== null && v !== undefined ? opts.links[c](r) : null;
          if (link) td.append(el("a", { href: link, text: fmt(v) }));
          else td.textContent = fmt(v);
          tr.append(td);
        }
        body.append(tr);
      }
      if (!rs.length) body.append(el("tr", {}, el("td", { colspan: String(columns.length), class: "muted", text: opts.empty || "no rows" })));
      if (rs.length > MAX_TABLE_ROWS) {  // a fleet's 10,000 nodes: the first rows drawn, the rest found by filter or sort
        body.append(el("tr", { class: "more" }, el("td", { colspan: String(columns.length), class: "muted",
          text: `${MAX_TABLE_ROWS.toLocaleString("en")} of ${rs.length.toLocaleString("en")} rows shown: ${filter ? "filter or " : ""}sort to find the others` })));
      }
    }
    for (const c of columns) {
      head.append(el("th", { text: c, title: "sort", onclick: () => { desc = sortKey === c ? !desc : false; sortKey = c; render(); } }));
    }
    t.append(el("thead", {}, head), body);
    wrap.append(t);
    if (filter) filter.addEventListener("input", render);
    render();
    return filter ? el("div", {}, filter, wrap) : wrap;
  }
  function stat(label, value, detail, cls) {
    const text = fmt(value, 1);  // a long value (a GPU's full name) in a smaller type: one line, not four
    return el("div", { class: "stat", "data-stat": label }, el("div", { class: "v " + (cls || "") + (text.length > 12 ? " long" : ""), text }),
      el("div", { class: "l", text: label }), detail ? el("div", { class: "d", text: detail }) : null);
  }
  function epoch(s) { return s ? Date.parse(s.replace(" ", "T") + "Z") / 1000 : null; }
  function chart(target, title, times, series) {
    // series: [[label, values, colour]]
    const box = el("div", { class: "chart" });
    box.dataset.points = String(series.reduce((a, s) => a + s[1].filter((v) => v !== null && v !== undefined).length, 0));
    target.append(el("div", {}, el("h3", { text: title }), box));
    if (typeof uPlot === "undefined" || !times.length) { box.textContent = times.length ? "" : "no data in the range"; return; }
    const xs = times.map(epoch);
    const opts = {
      width: Math.max(320, Math.min(760, box.clientWidth || 640)), height: 220,
      series: [{}].concat(series.map(([label, _, colour]) => ({ label, stroke: colour, width: 1.5, spanGaps: false }))),
      axes: [{}, { size: 60 }], legend: { live: true },
      hooks: { ready: [latest], setCursor: [(u) => { if (u.cursor.idx == null) latest(u); }] },
    };
    // eslint-disable-next-line no-new, no-undef
    new uPlot(opts, [xs].concat(series.map((s) => s[1])), box);
  }
  function latest(u) {  // the legend shows the newest point that has a value, not "--", until hovered
    const n = u.data[0].length;
    let i = n - 1;
    while (i > 0 && u.data.slice(1).every((ys) => ys[i] === null || ys[i] === undefined)) i--;
    if (n) u.setLegend({ idx: i }, false);
  }

  // -- the controls ----------------------------------------------------------------------------
  function controls() {
    const r = document.getElementById("range"), f = document.getElementById("refresh");
    r.value = state.range; f.value = state.refresh;
    if (REPORT) { r.disabled = true; f.disabled = true; }
    const apply = () => {
      state.range = r.value; state.refresh = f.value;
      const p = new URLSearchParams(location.search);
      p.set("range", state.range);
      if (state.refresh !== "0") p.set("refresh", state.refresh); else p.delete("refresh");
      history.replaceState(null, "", location.pathname + "?" + p.toString());
      navLinks(); schedule(); load();
    };
    r.addEventListener("change", apply); f.addEventListener("change", apply);
    for (const a of document.querySelectorAll("nav a")) {
      a.dataset.path = a.getAttribute("href");
      if (a.dataset.nav === main.dataset.page || (main.dataset.page === "job" && a.dataset.nav === "jobs")) a.classList.add("active");
    }
    navLinks();
  }
  function navLinks() {
    if (REPORT) return;
    for (const a of document.querySelectorAll("nav a")) a.setAttribute("href", link(a.dataset.path));
  }
  // a page's link that keeps the time range (the state a shared URL carries)
  function link(path) {
    if (!REPORT) return path + (path.includes("?") ? "&" : "?") + "range=" + state.range;
    // in a report: the page's section in this file (a job not in the report: its row in the jobs table)
    const m = path.match(/^\/ui\/jobs\/([^?]+)/);
    if (m) return document.getElementById("job-" + decodeURIComponent(m[1])) || jobsInReport().includes(decodeURIComponent(m[1])) ? "#job-" + m[1] : "#jobs";
    if (path.startsWith("/ui/alerts")) return "#alerts";
    return "#" + (path.replace(/^\/ui\/?/, "").split("?")[0] || "fleet");
  }
  function jobsInReport() { return REPORT && window.CMDARE_DATA.$report ? window.CMDARE_DATA.$report.jobs : []; }
  function schedule() {
    if (timer) clearInterval(timer);
    timer = null;
    const s = Number(state.refresh);
    if (s > 0 && !REPORT) timer = setInterval(load, s * 1000);
  }

  // -- pages -------------------------------------------------------------------------------------
  const PAGES = {};

  PAGES.fleet = async function (out) {
    const label = params.get("label") || "";
    // a drill-down (a job's or a node's GPUs), from a row of the fleet-wide heatmap
    const focus = REPORT ? {} : { job: params.get("job") || "", node: params.get("node") || "" };
    // rows per gpu, node or job (default: per GPU up to 10,000 GPUs, else per job)
    const group = ["gpu", "node", "job"].includes(params.get("group")) ? params.get("group") : "";
    const q = { since: since() };
    const [sum, heat, nodes, revs] = await Promise.all([
      get("/api/v1/fleet", { since: q.since, nodes: "false" }),
      get("/api/v1/fleet/heatmap", { since: q.since, columns: 120, label, group, job: focus.job, node: focus.node }),
      get("/api/v1/nodes", { label }), get("/api/v1/revocations", q)]);
    main.dataset.dataMs = String(Math.round(performance.now() - started));
    const allRows = rowsOf(nodes);
    const nrows = focus.job || focus.node ? allRows.filter((r) => (!focus.job || r.job === focus.job) && (!focus.node || r.node === focus.node)) : allRows;
    const n = sum.nodes || {};
    if (!sum.nodes) for (const r of allRows) n[r.state || "unknown"] = (n[r.state || "unknown"] || 0) + 1;  // the table loaded anyway
    const g = sum.gpus, gp = sum.goodput;
    const strip = el("div", { class: "strip" },
      stat("nodes alive", n.alive || 0, Object.entries(n).map(([k, v]) => `${k} ${v}`).join(", ")),
      stat("GPUs busy", g.busy, `idle ${g.idle}`),
      stat("GPUs idle", g.idle, `mean util < ${sum.gpu_thresholds.busy_pct} %`, g.idle ? "warn" : ""),
      stat("GPUs throttled", g.throttled, `of the busy and idle, ≥ ${sum.gpu_thresholds.throttled_pct} % of samples`, g.throttled ? "warn" : ""),
      stat("GPUs failing", g.failing, "lost, Xid or ECC", g.failing ? "bad" : ""),
      stat("jobs running", sum.jobs.running, "with steps in the range"),
      stat("findings", Object.values(sum.findings).reduce((a, b) => a + b, 0),
        Object.entries(sum.findings).map(([k, v]) => `${k} ${v}`).join(", ") || "none", sum.findings.critical ? "bad" : ""),
      stat("alerts firing", sum.alerts.firing || 0, `pending ${sum.alerts.pending || 0}`, sum.alerts.firing ? "bad" : ""),
      stat("goodput", gp.productive_pct === null ? "n/a" : gp.productive_pct + " %", `${gp.jobs} jobs, their time in the range`));
    out.append(strip);
    if (!REPORT) {
      const f = el("form", { class: "labelfilter" }, el("label", { text: "nodes with label " }),
        el("input", { name: "label", placeholder: "team=vision", value: label, size: "24" }), el("button", { type: "submit", text: "filter" }));
      f.addEventListener("submit", (e) => {
        e.preventDefault();
        const p = new URLSearchParams(location.search), v = f.elements.label.value.trim();
        if (v) p.set("label", v); else p.delete("label");
        location.search = p.toString();
      });
      out.append(f);
    }
    const scope = focus.job ? ` of job ${focus.job}` : focus.node ? ` of node ${focus.node}` : "";
    const back = scope ? el("a", { class: "back", href: link(drill({ job: null, node: null })), text: "← the whole fleet" }) : null;
    out.append(section("GPU utilisation" + scope + (label ? ` (nodes with ${label})` : ""), back, heatmap(heat)));
    out.append(section("Revocations", timeline(rowsOf(revs), heat)));
    const cols = nodes.columns.filter((c) => ["node", "role", "job", "zone", "instance_type", "spot", "state", "lives", "last_seen", "gpus", "not_ok"].includes(c));
    out.append(section("Nodes (" + nrows.length + ")", table(cols, nrows, {
      filter: true, links: { job: (r) => link("/ui/jobs/" + encodeURIComponent(r.job)) },
      highlight: (r) => r.state === "lost" || r.state === "revoked",
    })));
  };

  // colour of a utilisation in whole percent: blue (0) to red (100)
  const PALETTE = (() => {
    const dark = matchMedia("(prefers-color-scheme: dark)").matches, out = [];
    const cv = document.createElement("canvas"); cv.width = 1; cv.height = 1;
    const c = cv.getContext("2d", { willReadFrequently: true });
    for (let u = 0; u <= 100; u++) {
      const t = u / 100;
      c.fillStyle = `hsl(${220 - 200 * t}, 75%, ${dark ? 25 + 35 * t : 92 - 45 * t}%)`;
      c.fillRect(0, 0, 1, 1);
      out.push(c.getImageData(0, 0, 1, 1).data.slice(0, 3));
    }
    return out;
  })();

  // the fleet page's URL with a drill-down set (or cleared: null)
  function drill(set) {
    const p = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(set)) if (v === null) p.delete(k); else p.set(k, v);
    p.delete("range"); p.delete("group");  // a drill-down shows GPUs; back on the fleet: as the page chooses
    const s = p.toString();
    return location.pathname + (s ? "?" + s : "");
  }
  function rowLabel(h, r) {
    const n = (k, one) => `${k} ${one}${k === 1 ? "" : "s"}`;
    if (h.group === "job") return `${r.job === null ? "(no job)" : r.job} · ${n(r.gpus, "GPU")} on ${n(r.nodes, "node")}`;
    if (h.group === "node") return `${r.node} · ${n(r.gpus, "GPU")} · ${r.job || "(no job)"}`;
    return `${r.job || "(no job)"} · ${r.node} · ${r.gpu}`;
  }

  function heatmap(h) {
    const box = el("div", { class: "heat", "data-rows": String(h.rows.length), "data-group": h.group || "gpu" });
    if (!h.rows.length) { box.textContent = "no GPU samples in the range"; return box; }
    const nx = h.times.length, ny = h.rows.length;
    const cellW = Math.max(3, Math.floor(900 / Math.max(1, nx))), cellH = ny > 1000 ? 1 : ny > 400 ? 2 : 12;
    const top = 4, font = "11px system-ui, sans-serif", MAX_LABEL = 420;
    const measure = document.createElement("canvas").getContext("2d");
    measure.font = font;
    // row labels as wide as the widest needs (up to MAX_LABEL px; past it, cut in the middle:
    // the job's start and the GPU at the end stay readable)
    const labels = cellH >= 10 ? h.rows.map((r) => fitLabel(measure, rowLabel(h, r), MAX_LABEL - 10)) : [];
    const left = cellH >= 10 ? Math.ceil(Math.max(60, ...labels.map((l) => measure.measureText(l).width))) + 12 : 8;
    // one pixel per cell, drawn once, then scaled up without smoothing: 8,000 GPUs x 96
    // buckets is 768k pixels, not 768k fillRect calls
    const img = new ImageData(nx, ny);
    for (let i = 0; i < ny; i++) {
      const line = h.util_pct[i];
      for (let j = 0; j < nx; j++) {
        const u = line[j];
        if (u === null || u === undefined) continue;
        const k = 4 * (i * nx + j), c = PALETTE[Math.max(0, Math.min(100, Math.round(u)))];
        img.data[k] = c[0]; img.data[k + 1] = c[1]; img.data[k + 2] = c[2]; img.data[k + 3] = 255;
      }
    }
    const small = document.createElement("canvas");
    small.width = nx; small.height = ny;
    small.getContext("2d").putImageData(img, 0, 0);
    const cv = el("canvas", {});
    const W = left + cellW * nx + 4, H = top + cellH * ny + 22;
    cv.width = W; cv.height = H; cv.style.width = W + "px"; cv.style.height = H + "px";
    const c = cv.getContext("2d");
    c.imageSmoothingEnabled = false;
    c.drawImage(small, left, top, cellW * nx, cellH * ny);
    const dark = matchMedia("(prefers-color-scheme: dark)").matches;
    c.font = font;
    let lastJob;
    h.rows.forEach((r, i) => {
      const y = top + i * cellH;
      c.fillStyle = dark ? "#98a2b3" : "#667085";
      if (cellH >= 10) c.fillText(labels[i], 2, y + cellH - 2);
      if (h.group !== "job" && r.job !== lastJob && i && cellH >= 10) c.fillRect(0, y, W, 1);
      lastJob = r.job;
    });
    if (cellH >= 10 && cellW > 4) {  // gaps between cells, as a grid, where cells are large enough to see
      c.fillStyle = dark ? "#111418" : "#ffffff";
      for (let j = 1; j < nx; j++) c.fillRect(left + j * cellW - 1, top, 1, cellH * ny);
      for (let i = 1; i < ny; i++) c.fillRect(left, top + i * cellH - 1, cellW * nx, 1);
    }
    // time ticks on cell boundaries: a tick at column j marks where its cell starts, labelled
    // with that cell's start (the first with its date and UTC), far enough apart to read
    c.fillStyle = dark ? "#98a2b3" : "#667085";
    const ticks = [], y0 = top + cellH * ny, short = (t) => t.slice(11, h.step_seconds % 60 ? 19 : 16);
    const first = h.times[0].slice(0, h.step_seconds % 60 ? 19 : 16) + " UTC";
    const every = Math.max(1, Math.ceil((measure.measureText(short(h.times[0])).width + 24) / cellW));
    for (let j = 0; j < nx; j += j ? every : Math.max(every, Math.ceil((measure.measureText(first).width + 24) / cellW))) {
      const x = left + j * cellW, text = j ? short(h.times[j]) : first;
      if (x + measure.measureText(text).width > W) break;
      c.fillRect(x, y0, 1, 5);
      c.fillText(text, x + 2, H - 4);
      ticks.push({ x: x - left, time: h.times[j] });
    }
    cv.dataset.ticks = JSON.stringify(ticks);
    cv.dataset.cut = String(labels.filter((l) => l.includes("…")).length);
    cv.dataset.left = String(left);
    const tip = el("div", { class: "tip", hidden: "" });
    document.body.append(tip);
    // a row of a job or a node opens its GPUs (the same page, drilled down; in a report: no server to ask)
    const drillable = !REPORT && (h.group === "job" || h.group === "node");
    cv.addEventListener("mousemove", (e) => {
      const rc = cv.getBoundingClientRect();
      const i = Math.floor((e.clientY - rc.top - top) / cellH), j = Math.floor((e.clientX - rc.left - left) / cellW);
      if (i < 0 || i >= ny || j < 0 || j >= nx) { tip.hidden = true; return; }
      const r = h.rows[i], u = h.util_pct[i][j];
      const who = h.group === "job" || h.group === "node" ? rowLabel(h, r) : `${r.node} GPU ${r.gpu} (${r.name || ""})\njob ${r.job || "none"}`;
      tip.textContent = `${who}\n${h.times[j]} +${h.step_seconds}s\n${h.group === "job" || h.group === "node" ? "mean " : ""}utilisation ${u === null ? "no sample" : u + " %"}${drillable ? "\nclick: its GPUs" : ""}`;
      tip.hidden = false; tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 12 + "px";
    });
    cv.addEventListener("mouseleave", () => { tip.hidden = true; });
    if (drillable) {
      cv.style.cursor = "pointer";
      cv.addEventListener("click", (e) => {
        const rc = cv.getBoundingClientRect(), i = Math.floor((e.clientY - rc.top - top) / cellH);
        const r = h.rows[i];
        if (!r || (h.group === "job" && r.job === null)) return;  // samples of no job: nothing to filter on
        location.href = link(h.group === "job" ? drill({ job: r.job, node: null }) : drill({ node: r.node, job: null }));
      });
    }
    box.append(cv);
    const what = { job: `${ny} jobs (${h.gpus} GPUs, a row per job: click a job for its GPUs)`,
      node: `${ny} nodes (${h.gpus} GPUs)` }[h.group] || `${ny} GPUs`;
    return el("div", {}, el("div", { class: "legend", text: `${what}, one column per ${h.step_seconds} s${h.rollup ? " (5-minute rollups)" : ""}; colour: mean utilisation (scale below); ${h.group === "job" || h.group === "node" ? "" : "rows grouped by job; "}hover for the figures` }), box, scale());
  }
  function fitLabel(c, text, width) {  // text cut in the middle to fit width px ("…" where cut)
    if (c.measureText(text).width <= width) return text;
    let a = Math.ceil(text.length / 2), b = text.length - a;
    while (a + b > 4 && c.measureText(text.slice(0, a) + "…" + text.slice(text.length - b)).width > width) {
      if (a >= b) a--; else b--;
    }
    return text.slice(0, a) + "…" + text.slice(text.length - b);
  }
  function scale() {  // the heatmap's colours, 0 to 100 % mean utilisation, from the palette the cells use
    const bar = el("div", { class: "scalebar" });
    const stops = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100].map((u) => `rgb(${PALETTE[u].slice(0, 3).join(",")}) ${u}%`);
    bar.style.backgroundImage = `linear-gradient(to right, ${stops.join(", ")})`;
    const labels = el("div", { class: "scalelabels" }, ...["0 %", "25 %", "50 %", "75 %", "100 %"].map((t) => el("span", { text: t })));
    return el("div", { class: "scale", "data-scale": "utilisation" }, el("span", { class: "muted", text: "mean utilisation " }),
      el("div", { class: "scalebox" }, bar, labels), el("span", { class: "muted", text: " blank: no sample" }));
  }

  function timeline(revs, heat) {
    const box = el("div", { class: "timeline", "data-marks": String(revs.length) });
    if (!revs.length) { box.textContent = "no revocation in the range"; box.classList.add("muted"); return box; }
    const t0 = heat.times.length ? epoch(heat.times[0]) : Math.min(...revs.map((r) => epoch(r.noticed)));
    const t1 = heat.times.length ? epoch(heat.times[heat.times.length - 1]) + heat.step_seconds : t0 + 1;
    for (const r of revs) {
      const at = epoch(r.noticed);
      const x = Math.max(0, Math.min(100, (100 * (at - t0)) / Math.max(1, t1 - t0)));
      box.append(el("div", { class: "mark", style: `left:${x}%`, title: Object.entries(r).map(([k, v]) => `${k}: ${fmt(v)}`).join("\n") }));
    }
    return el("div", {}, box, table(Object.keys(revs[0]), revs, {}));
  }

  PAGES.jobs = async function (out) {
    const jobs = await get("/api/v1/jobs", { since: since() });
    out.append(table(jobs.columns, rowsOf(jobs), {
      filter: true, links: { job: (r) => link("/ui/jobs/" + encodeURIComponent(r.job)) },
      highlight: (r) => r.input_bound && r.input_bound !== "not input-bound",
    }));
  };

  PAGES.job = async function (out, opts) {
    const job = (opts && opts.job) || main.dataset.job;
    const base = "/api/v1/jobs/" + encodeURIComponent(job);
    const detail = await get(base);  // first: an unknown job is said once, as the API says it
    const [series, goodput] = await Promise.all([get(base + "/series", { since: since(), columns: 120 }), get(base + "/goodput", { since: since() })]);
    const s = rowsOf(detail.summary)[0] || {};
    out.append(el("div", { class: "strip" },
      stat("steps/s per rank", s.steps_per_s), stat("examples/s", s.examples_per_s),
      stat("input wait", s.input_wait_pct === null ? "n/a" : s.input_wait_pct + " %", s.input_bound,
        s.input_bound && s.input_bound !== "not input-bound" ? "warn" : ""),
      stat("ranks", s.ranks, `${s.nodes} nodes, ${s.runs} runs`),
      // the declared accelerator, else the GPUs' own names; the model named as the model
      stat("accelerator", s.accelerator || [...new Set(series.gpus.rows.map((g) => g.name).filter(Boolean)
        .map((n) => n.replace(/^NVIDIA /, "")))].join(", ") || "not known",
        s.model ? `model ${s.model}` : "model not declared"),
      stat("state", s.state, s.ended ? "ended " + s.ended : "latest run",
        ["crashed", "failed", "node lost"].includes(s.state) ? "bad" : ""),
      stat("GPUs active / allocated", `${series.gpus.active} / ${series.gpus.allocated}`,
        `active: mean utilisation ≥ ${series.gpus.busy_pct} % over the range`,
        series.gpus.active < series.gpus.allocated ? "warn" : "")));
    const advice = get(base + "/advice").catch((e) => ({ error: String(e.message || e) }));
    const findings = rowsOf(detail.findings);
    const fsec = section("Findings (" + findings.length + ")");
    if (!findings.length) fsec.append(el("p", { class: "muted", text: "none stored for this job (analyze bottlenecks --job stores them)" }));
    for (const f of findings) fsec.append(findingCard(f));
    out.append(fsec);
    const adv = section("What to do (the findings' recommendations, run now)");
    out.append(adv);
    adv.append(el("p", { class: "loading", text: "running the detectors and recommenders…" }));
    advice.then((a) => { adv.querySelector(".loading").remove(); adviceInto(adv, a); adv.dataset.ready = "1"; });
    const sc = section("Scaling: steps/s against workers (measured runs of this model, accelerator and PS count; the cluster fit)");
    out.append(sc);
    get(base + "/scaling").then((c) => { scalingInto(sc, c); sc.dataset.scaling = "1"; })
      .catch((e) => { sc.append(el("p", { class: "bad", text: String(e.message || e) })); sc.dataset.scaling = "1"; });
    const ts = series.times, ss = series.series;
    const charts = el("div", { class: "grid2" });
    chart(charts, "steps/s (all ranks)", ts, [["steps/s", ss.steps_per_second || [], "#2563eb"]]);
    chart(charts, "step time (s)", ts, [["mean", ss.step_mean_s || [], "#2563eb"], ["p95 (mean of ranks)", ss.step_p95_s || [], "#b45309"], ["max", ss.step_max_s || [], "#b91c1c"]]);
    chart(charts, "input wait (% of step time)", ts, [["input wait %", ss.input_wait_pct || [], "#7c3aed"]]);
    chart(charts, "GPU utilisation (% of the job's GPUs, mean)", ts, [["GPU utilisation %", ss.gpu_util_pct || [], "#059669"]]);
    out.append(section("Over time" + (series.step_seconds ? ` (per ${series.step_seconds} s)` : ""), charts));
    // job_sm_pct: the SMs the job's own processes used (by PID); other_processes: processes of no rank of it
    out.append(section("GPUs of the job's nodes",
      table(["node", "gpu", "name", "util_pct", "mem_used_gib", "active", "job_processes", "job_sm_pct", "other_processes"],
      series.gpus.rows, { highlight: (r) => !r.active, empty: "no GPU samples from the job's nodes in the range" })));
    out.append(section("Checkpoints (" + series.checkpoints.length + ")", table(
      ["ts", "node", "rank", "action", "seconds", "mib", "step", "ok"], series.checkpoints,
      { highlight: (r) => r.ok === false, empty: "no checkpoint in the range" })));
    out.append(section("Runs: how each rank stands or ended", table(
      ["run", "rank", "node", "pid", "state", "started", "last_step", "ended", "steps", "why"], rowsOf(detail.runs || { columns: [], rows: [] }),
      { highlight: (r) => ["crashed", "failed", "node lost"].includes(r.state), empty: "no run reported" })));
    out.append(section("Ranks, slowest first", table(
      ["run", "rank", "node", "steps", "step_mean_s", "vs_median_pct", "step_p95_s", "input_wait_pct"], series.ranks,
      { highlight: (r) => (r.vs_median_pct || 0) >= 10 })));
    const parts = rowsOf(goodput);
    const wall = (parts.find((p) => p.category === "total") || {}).seconds || 0;
    const colours = { productive: "#15803d", input_wait: "#7c3aed", startup: "#0891b2", checkpoint_save: "#b45309",
      checkpoint_restore: "#ca8a04", revocation: "#b91c1c", ps_wait: "#db2777", straggler: "#ea580c", communication: "#2563eb",
      idle_accelerators: "#475569", other: "#98a2b3" };
    const bar = el("div", { class: "bar" });
    for (const p of parts) {
      if (p.category === "total" || !p.seconds) continue;
      bar.append(el("span", { style: `width:${(100 * p.seconds) / Math.max(wall, 1e-9)}%;background:${colours[p.category] || "#999"}`, title: `${p.category} ${fmt(p.seconds, 1)} s (${p.pct} %)` }));
    }
    out.append(section("Goodput and badput of the accelerator time in the range (the parts add up to the total)", bar,
      table(["category", "gpu_hours", "pct", "dollars"], parts, {})));
  };

  function scalingInto(box, c) {
    if (c.note) box.append(el("p", { class: "muted", text: c.note }));
    if (!c.measured.length) return;
    const xs = [...new Set(c.measured.map((m) => m.workers).concat(c.predicted.map((p) => p.workers)))].sort((a, b) => a - b);
    const mean = (w) => { const v = c.measured.filter((m) => m.workers === w).map((m) => m.steps_per_second); return v.length ? v.reduce((a, b) => a + b) / v.length : null; };
    const pred = (w, k) => { const p = c.predicted.find((q) => q.workers === w); return p ? (k === undefined ? p.steps_per_second : (p.interval ? p.interval[k] : null)) : null; };
    const series = [["measured (mean of runs)", xs.map(mean), "#b91c1c"]];
    if (c.predicted.length) series.push(["cluster fit", xs.map((w) => pred(w)), "#2563eb"], ["95 % interval, low", xs.map((w) => pred(w, 0)), "#93c5fd"], ["95 % interval, high", xs.map((w) => pred(w, 1)), "#93c5fd"]);
    const plot = el("div", { class: "chart", "data-measured": String(c.measured.length), "data-predicted": String(c.predicted.length) });
    box.append(plot);
    if (typeof uPlot !== "undefined") {
      // eslint-disable-next-line no-new, no-undef
      new uPlot({ width: 640, height: 240, scales: { x: { time: false } }, axes: [{ label: "workers" }, { label: "steps/s", size: 60 }],
        series: [{ label: "workers" }].concat(series.map(([label, , colour], i) => ({ label, stroke: colour, width: i ? 1.5 : 0,
          points: { show: i === 0, size: 8, fill: colour }, dash: i > 1 ? [4, 4] : undefined, spanGaps: true }))),
        hooks: { ready: [latest], setCursor: [(u) => { if (u.cursor.idx == null) latest(u); }] } },
        [xs].concat(series.map((x) => x[1])), plot);
    }
    box.append(table(["workers", "job", "steps_per_second"], c.measured, {}));
    const ex = c.predicted.filter((p) => p.extrapolated).map((p) => p.workers);
    if (ex.length) box.append(el("p", { class: "muted", text: `the fit extrapolates at ${ex[0]} workers and more (past what it was fitted on)` }));
  }

  function adviceInto(box, a) {
    if (a.error) { box.append(el("p", { class: "bad", text: a.error })); return; }
    for (const x of a.actions || []) {  // findings no recommender answers: the detector's own action
      box.append(el("div", { class: "finding info", "data-action": x.kind }, el("b", { text: x.kind }),
        el("span", { class: "muted", text: x.node ? " " + x.node : "" }), el("div", { class: "action", text: x.action })));
    }
    if (!a.recommendations.length && !(a.actions || []).length) {
      box.append(el("p", { class: "muted", text: a.findings.length ? "the findings suggest no recommendation" : "no finding now" }));
    }
    for (const r of a.recommendations) {
      const card = el("div", { class: "finding info", "data-recommender": r.kind }, el("b", { text: r.kind }), " ",
        el("code", { text: r.command }));
      if (!r.ok) card.append(el("div", { class: "muted", text: "cannot answer: " + r.reason }));
      for (const x of r.recommendations || []) {
        card.append(el("div", { class: "action", text: Object.entries(x.action).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") +
          (Object.keys(x.predicted || {}).length ? " → " + Object.entries(x.predicted).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") : "") }));
        card.append(el("div", { text: x.why }));
        const ev = { interval: x.interval, cost: x.cost, fits: x.fit_ids, assumptions: x.assumptions };
        const d = el("details", {}, el("summary", { text: "evidence, fits and assumptions" }), el("div", { class: "ev", text: JSON.stringify(ev, null, 1) }));
        for (const fid of x.fit_ids || []) d.append(el("a", { href: link("/ui/models") + "#fit-" + fid, text: " fit " + fid }));
        card.append(d);
      }
      box.append(card);
    }
  }

  function findingCard(f) {
    let ev = f.evidence;
    try { ev = JSON.stringify(JSON.parse(f.evidence), null, 1); } catch (e) { /* text as stored */ }
    return el("div", { class: "finding " + (f.severity || ""), "data-kind": f.kind },
      el("div", {}, el("b", { text: `${f.kind} · ${f.severity}` }), " ",
        el("span", { class: "muted", text: `${f.job || ""} ${f.node || ""} ${f.rank === null || f.rank === undefined ? "" : "rank " + f.rank} · confidence ${fmt(f.confidence, 2)} · ${fmt(f.window_start)} → ${fmt(f.window_end)}` })),
      el("div", { text: f.summary }), el("details", {}, el("summary", { text: "evidence" }), el("div", { class: "ev", text: ev })));
  }

  PAGES.findings = async function (out) {
    const t = await get("/api/v1/findings", { since: since() });
    const rows = rowsOf(t);
    out.append(el("p", { class: "muted", text: `${rows.length} stored findings, worst first (analyze bottlenecks stores them; the collector's detector schedule too)` }));
    for (const f of rows.slice(0, 500)) {
      const card = findingCard(f);
      if (f.job) card.firstChild.append(" ", el("a", { href: link("/ui/jobs/" + encodeURIComponent(f.job)), text: "job page" }));
      out.append(card);
    }
  };

  PAGES.alerts = async function (out) {
    const rule = params.get("rule");
    const a = await get("/api/v1/alerts", rule ? { rule } : {});
    const rows = rowsOf(a.alerts), rules = rowsOf(a.rules);
    if (rule) out.append(el("p", {}, "rule ", el("b", { text: rule }), " · ", el("a", { href: "/ui/alerts", text: "all alerts" })));
    const by = {};
    for (const r of rows) by[r.state] = (by[r.state] || 0) + 1;
    out.append(el("div", { class: "strip" }, stat("firing", by.firing || 0, "", by.firing ? "bad" : ""),
      stat("pending", by.pending || 0), stat("inhibited", by.inhibited || 0), stat("resolved", by.resolved || 0)));
    out.append(section("Alerts", table(["rule", "state", "since", "value", "labels", "summary", "inhibited_by"], rows, {
      filter: true, links: { rule: (r) => link("/ui/alerts?rule=" + encodeURIComponent(r.rule)) },
      highlight: (r) => r.state === "firing", empty: "no alert" + (rule ? " of this rule" : ""),
    })));
    out.append(section("Rules", table(["rule", "health", "last_error", "last_eval", "eval_seconds", "instances"], rules, {
      highlight: (r) => r.health && r.health !== "ok", empty: "no rule evaluated yet",
    })));
  };

  PAGES.recommendations = async function (out) {
    const f = rowsOf(await get("/api/v1/findings", { since: since() }));
    const jobs = [...new Set(f.map((x) => x.job).filter((j) => j))];
    out.append(el("p", { class: "muted", text: `${jobs.length} jobs with stored findings in the range` +
      (jobs.length > 20 ? " (the first 20, worst first)" : "") + ": for each, the detectors run afresh and the recommendations their findings suggest" }));
    for (const job of jobs.slice(0, 20)) {
      const sec = el("section", { class: "advice", "data-job": job }, el("h2", {}, el("a", { href: link("/ui/jobs/" + encodeURIComponent(job)), text: job })));
      out.append(sec);
      try { adviceInto(sec, await get("/api/v1/jobs/" + encodeURIComponent(job) + "/advice")); } catch (e) {
        sec.append(el("p", { class: "bad", text: String(e.message || e) }));
      }
    }
  };

  PAGES.models = async function (out) {
    const fits = (await get("/api/v1/fits")).fits;
    if (!fits.length) { out.append(el("p", { class: "muted", text: "no stored fit: analyze fit speed | cluster | overhead | lifetime" })); return; }
    for (const f of fits) {
      const pct = (v) => (v === null || v === undefined ? "n/a" : fmt(100 * v, 1) + " %");
      const card = el("section", { class: "fit", id: "fit-" + f.fit_id, "data-kind": f.kind },
        el("h2", { text: `${f.kind}: ${f.family}` }),
        el("div", { class: "strip" }, stat("held-out MAPE", pct(f.cv_mape), "leave one group out"),
          stat("held-out R²", f.cv_r2 === null ? "n/a" : fmt(f.cv_r2, 3)), stat("rows", f.rows, `${f.groups} groups`),
          f.in_range ? stat("inside the fitted ranges", pct(f.in_range.mape), `${f.in_range.rows} rows held out`) : null,
          f.extrapolated ? stat("extrapolated", pct(f.extrapolated.mape), `${f.extrapolated.rows} rows held out`) : null),
        el("p", { class: "muted", text: `fit ${f.fit_id}, fitted ${fmt(f.fitted_at)}` +
          (f.families ? "; families tried: " + Object.entries(f.families).map(([k, v]) => `${k} ${pct(v.cv_mape)}`).join(", ") : "") +
          (f.worst && f.worst.length ? "; predicted worst: " + f.worst.map((w) => `${w.group} ${pct(w.ape)}`).join(", ") : "") }));
      if (f.held_out && f.held_out.length) card.append(scatter(f.held_out, f.kind));
      if (f.input_ranges) {
        const rows = Object.entries(f.input_ranges).map(([k, v]) => ({ input: k, range: Array.isArray(v) && typeof v[0] === "number" ? `${fmt(v[0])} .. ${fmt(v[1])}` : [].concat(v).join(", ") }));
        card.append(el("h3", { text: "fitted on (a prediction outside says it extrapolates)" }), table(["input", "range"], rows, {}));
      }
      if (f.coefficients && Object.keys(f.coefficients).length) {
        card.append(el("h3", { text: "coefficients" }), table(["name", "value"], Object.entries(f.coefficients).map(([k, v]) => ({ name: k, value: v })), {}));
      }
      out.append(card);
    }
  };

  function scatter(points, kind) {
    // held-out predicted against measured, log-log, with the y = x line: each point a row
    const W = 420, H = 320, pad = 46;
    const cv = el("canvas", { class: "scatter", "data-points": String(points.length) });
    cv.width = W; cv.height = H;
    const c = cv.getContext("2d");
    const vals = points.flatMap((p) => [p[1], p[2]]).filter((v) => v > 0 && isFinite(v));
    if (!vals.length) return el("p", { class: "muted", text: "no positive values to plot" });
    const lo = Math.log10(Math.min(...vals)) - 0.05, hi = Math.log10(Math.max(...vals)) + 0.05;
    const X = (v) => pad + ((Math.log10(v) - lo) / (hi - lo)) * (W - pad - 10);
    const Y = (v) => H - pad - ((Math.log10(v) - lo) / (hi - lo)) * (H - pad - 10);
    const dark = matchMedia("(prefers-color-scheme: dark)").matches;
    c.strokeStyle = dark ? "#2a2f37" : "#e4e7ec"; c.strokeRect(pad, 10, W - pad - 10, H - pad - 10);
    c.strokeStyle = dark ? "#98a2b3" : "#667085"; c.beginPath();
    c.moveTo(X(10 ** lo), Y(10 ** lo)); c.lineTo(X(10 ** hi), Y(10 ** hi)); c.stroke();
    c.fillStyle = "#2563eb";
    for (const [, m, p] of points) if (m > 0 && p > 0) { c.beginPath(); c.arc(X(m), Y(p), 3, 0, 2 * Math.PI); c.fill(); }
    c.fillStyle = dark ? "#98a2b3" : "#667085"; c.font = "11px system-ui, sans-serif";
    c.fillText("measured (log)", W / 2 - 30, H - 8);
    c.save(); c.translate(12, H / 2 + 40); c.rotate(-Math.PI / 2); c.fillText("held-out predicted (log)", 0, 0); c.restore();
    c.fillText(fmt(10 ** lo, 3), pad, H - pad + 14); c.fillText(fmt(10 ** hi, 3), W - 60, H - pad + 14);
    return el("div", {}, el("h3", { text: `held out, predicted vs measured (${points.length} rows; the line: exact)` }), cv);
  }

  PAGES.report = async function (out) {
    const r = window.CMDARE_DATA.$report || { jobs: [] };
    out.append(el("p", { class: "muted", text: `made ${fmt(r.made)} UTC from ${r.since ? "data since " + fmt(r.since) + " UTC" : "all the data"}` +
      (r.jobs_left_out ? `; ${r.jobs_left_out} more jobs are in the jobs table only` : "") }));
    const parts = [["fleet", "Fleet"], ["jobs", "Jobs"]].concat(r.jobs.map((j) => ["job", "Job " + j, j]))
      .concat([["findings", "Findings"], ["recommendations", "Recommendations"], ["alerts", "Alerts"], ["models", "Models"]]);
    // contents first; each job's page folded under a line that says how it stands (a report of
    // many jobs was one page per job stacked: 33,000 px), open when the report is of one job
    // or a link leads to it
    const contents = el("nav", { class: "contents" }, el("b", { text: "Contents: " }));
    out.append(contents);
    for (const [name, title, job] of parts) {
      const id = job ? "job-" + job : name;
      contents.append(el("a", { href: "#" + id, text: job || title }), " ");
      const sec = el("section", { class: "page", id, "data-page": name }, el("h1", { text: title }));
      try { await PAGES[name](sec, { job }); } catch (e) { sec.append(el("p", { class: "bad", text: String(e.message || e) })); }
      if (!job) { out.append(sec); continue; }
      const fold = el("details", { class: "page", id, "data-page": name }), head = el("summary", {});
      sec.removeAttribute("id");
      const state = sec.querySelector('[data-stat="state"] .v'), found = sec.querySelectorAll(".finding").length;
      head.append(el("h1", { text: title }), el("span", { class: "muted", text:
        ` ${state ? state.textContent : ""} · ${found} finding${found === 1 ? "" : "s"}` }));
      fold.append(head, sec);
      if (r.jobs.length === 1) fold.open = true;
      out.append(fold);
    }
    const opened = () => {  // a link to a job's page (the jobs table, the contents) opens it
      const t = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
      if (t && t.tagName === "DETAILS") { t.open = true; t.scrollIntoView(); }
    };
    window.addEventListener("hashchange", opened);
    opened();
  };

  // -- load --------------------------------------------------------------------------------------
  let loading = false;
  let started = 0;  // when the current load began (the pages' own timings: data-data-ms, data-render-ms)
  async function load() {
    if (loading) return;
    loading = true;
    const name = main.dataset.page;
    const out = el("div", { id: "content" });
    const t0 = performance.now();
    started = t0;
    try {
      await PAGES[name](out);
      main.dataset.renderMs = String(Math.round(performance.now() - t0));
      const h1 = main.querySelector("h1");
      main.textContent = "";
      main.append(h1, out);
      document.getElementById("error").hidden = true;
      document.getElementById("updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
      main.dataset.ready = "1";
    } catch (e) {
      showError(e);
      main.dataset.ready = "error";
    } finally {
      loading = false;
    }
  }
  controls();
  schedule();
  load();
})();
