/* app.js - psd's dashboard: reads /api/job every second and /api/history
 * every two, and draws them with uPlot. Everything comes from the psd that
 * served the page; nothing else is fetched. */
"use strict";

(function () {
  const COLORS = ["#1a73e8", "#e8710a", "#12b5cb", "#9334e6", "#188038", "#d01884", "#f9ab00", "#5f6368"];
  const EVENT_COLORS = {
    joined: "#137333", left: "#5f6b76", lost: "#b00020", checkpoint: "#1a56c4",
    paused: "#b05a00", resumed: "#b05a00", settings: "#7b1fa2",
  };
  const JOB_MS = 1000;
  const HISTORY_MS = 2000;

  let job = null;
  let hist = null;
  let lastHistory = 0;
  const charts = {};

  const $ = (id) => document.getElementById(id);
  const color = (shard) => COLORS[shard % COLORS.length];

  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    return Number(v).toFixed(digits);
  }

  function sig(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    return Number(v).toPrecision(4).replace(/\.?0+(e|$)/, "$1");
  }

  function duration(s) {
    if (s === null || !isFinite(s)) return "–";
    s = Math.max(0, s);
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h" + String(m % 60).padStart(2, "0") + "m";
  }

  function bytes(v) {
    if (v === null || !isFinite(v)) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (Math.abs(v) >= 1000 && i < units.length - 1) {
      v /= 1000;
      i++;
    }
    return (i ? v.toFixed(1) : v.toFixed(0)) + " " + units[i];
  }

  function count(v) {
    if (v === null || !isFinite(v)) return "–";
    return Number(v).toLocaleString("en-US");
  }

  async function get(path) {
    const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status + " " + (await r.text()).trim());
    return r.json();
  }

  function setStatus(text, error) {
    const el = $("status");
    el.textContent = text;
    el.className = error ? "status error" : "status";
  }

  /* ---- the job and the workers ------------------------------------------ */

  function scheduleText(j) {
    const s = j.schedule;
    let t = s.lr_schedule;
    if (s.lr_schedule === "step") t += ": ×" + s.lr_gamma + " every " + s.lr_step_size + " versions";
    else if (s.lr_schedule === "cosine") t += " to " + s.lr_min + " over " + s.lr_decay_versions + " versions";
    if (Number(s.warmup_versions) > 0) t += ", warm-up " + s.warmup_versions + " versions";
    return "base " + sig(j.lr) + ", " + t;
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function renderJob() {
    $("mode").textContent = job.mode;
    $("optimizer").textContent = job.optimizer;
    $("lr").textContent = sig(job.lr_current);
    $("schedule").textContent = scheduleText(job);
    $("version").textContent = count(job.version);
    $("parameters").textContent = count(job.parameters);
    $("uptime").textContent = duration(job.uptime);
    $("paused").textContent = job.paused ? "paused" : job.initialized ? "running" : "waiting for a worker";
    const live = job.workers.filter((w) => w.state === "connected").length;
    $("nworkers").textContent = live + " of " + job.workers_expected;

    const tbody = $("workers").querySelector("tbody");
    tbody.replaceChildren();
    for (const w of job.workers) {
      const tr = document.createElement("tr");
      tr.dataset.shard = w.shard;
      tr.className = w.state;
      const sh = cell(tr, "");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = color(w.shard);
      sh.appendChild(sw);
      sh.appendChild(document.createTextNode(w.shard + "/" + w.shards));
      const st = cell(tr, w.state, "state");
      if (w.why) st.title = w.why;
      cell(tr, w.transport);
      cell(tr, w.table_transport);
      cell(tr, count(w.pushes));
      cell(tr, num(w.samples_per_second, 0));
      cell(tr, num(w.loss, 4), "loss");
      cell(tr, w.accuracy === null ? "–" : (100 * w.accuracy).toFixed(2) + "%");
      cell(tr, count(w.staleness));
      cell(tr, count(w.epoch));
      cell(tr, w.address);
      tbody.appendChild(tr);
    }
  }

  /* ---- the part's replicas (PROTOCOL.md 17) ------------------------------ */

  function renderReplicas() {
    const r = job.replication;
    const follower = r && r.role === "follower";
    const shown = r && (follower || r.followers.length > 0);
    $("replicas-section").hidden = !shown;
    if (!shown) return;
    const tbody = $("replicas").querySelector("tbody");
    tbody.replaceChildren();
    const row = (name, role, insync, lagBytes, lagVersions, lastFetch, cls) => {
      const tr = document.createElement("tr");
      tr.dataset.role = role;
      if (cls) tr.className = cls;
      cell(tr, name);
      cell(tr, role);
      cell(tr, insync, "insync");
      cell(tr, lagBytes);
      cell(tr, lagVersions);
      cell(tr, lastFetch);
      tbody.appendChild(tr);
    };
    if (follower) {
      $("replicas-summary").textContent = "this psd follows " + r.leader + " (replication " + r.mode +
        "), applied " + bytes(r.applied) + " of its log" + (r.error ? "; STOPPED: " + r.error : "");
      row("this psd", "follower", "–", count(r.lag_bytes), "–", "–", r.error ? "lost" : "");
      row(r.leader, "leader", "–", "–", "–", "–");
      return;
    }
    $("replicas-summary").textContent = "this psd leads its part (replication " + r.mode + "): " +
      r.insync + " of " + r.followers.length + " followers in sync, log at " + bytes(r.log_end);
    row("this psd", "leader", "–", "0", "0", "–");
    for (const f of r.followers) {
      row(f.addr, "follower", f.insync ? "yes" : "no", count(f.lag_bytes),
          f.lag_versions < 0 ? "?" : "≤ " + count(f.lag_versions),
          f.last_fetch < 0 ? "–" : num(f.last_fetch, 1) + " s ago", f.insync ? "" : "lost");
    }
  }

  /* ---- the job's part map and a move of parts (PROTOCOL.md 18) ---------- */

  function renderParts() {
    const p = job.parts;
    const shown = p && (p.epoch > 0 || p.moving || p.move);
    $("parts-section").hidden = !shown;
    if (!shown) return;
    let text = p.epoch > 0 ? "part map " + p.epoch + ": this psd is part " + p.self + " of " + p.n +
      " (the dense model on the first " + p.dense + ")" : "the workers' list is the part map";
    const m = p.move;
    if (m) {
      text += (p.moving ? "; MOVING to map " : "; the last move, to map ") + m.epoch + " (" + m.old_n + " parts to " +
        m.new_n + ", " + num(m.seconds, 1) + " s): rows given " + count(m.rows_given) + ", taken " +
        count(m.rows_taken) + " (" + bytes(m.bytes_taken) + "), " + m.handed + " of " + m.sources +
        " sources handed over, longest handover " + count(m.handover_ms_max) + " ms";
    }
    if (p.dropping) text += "; dropping the rows that left";
    if (p.error) text += "; STOPPED: " + p.error;
    $("parts-summary").textContent = text;
  }

  function renderEvents() {
    const tbody = $("events").querySelector("tbody");
    tbody.replaceChildren();
    for (const e of hist.events.slice().reverse()) {
      const tr = document.createElement("tr");
      cell(tr, duration(e.t));
      cell(tr, count(e.version));
      cell(tr, e.kind, "ev-" + e.kind);
      cell(tr, e.text);
      tbody.appendChild(tr);
    }
    const st = hist.psd.stride;
    $("bound").textContent =
      "psd keeps at most " + hist.points_max + " points a series (now one per " + (st === 1 ? "sample" : st + " samples") +
      ") and the last " + hist.events_max + " events" +
      (hist.events_dropped ? " (" + hist.events_dropped + " older ones dropped)" : "") + ".";
  }

  /* ---- charts --------------------------------------------------------------- */

  /* Draws the events as dashed vertical lines on charts over time. */
  function eventLines() {
    return {
      hooks: {
        draw: [
          (u) => {
            if (!hist) return;
            const ctx = u.ctx;
            ctx.save();
            ctx.lineWidth = 1;
            ctx.setLineDash([4, 4]);
            for (const e of hist.events) {
              const x = Math.round(u.valToPos(e.t, "x", true));
              if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
              ctx.strokeStyle = EVENT_COLORS[e.kind] || "#888";
              ctx.beginPath();
              ctx.moveTo(x, u.bbox.top);
              ctx.lineTo(x, u.bbox.top + u.bbox.height);
              ctx.stroke();
            }
            ctx.restore();
          },
        ],
      },
    };
  }

  function chartWidth(el) {
    return Math.max(280, el.clientWidth - 16);
  }

  /* Creates chart id, or gives it new data when its series are the same
   * (key); records how many points each series got in data-points. */
  function plot(id, key, build, data, points) {
    const el = $(id);
    el.dataset.points = JSON.stringify(points);
    let c = charts[id];
    if (c && c.key !== key) {
      c.u.destroy();
      c = null;
    }
    if (!c) {
      const opts = build();
      opts.width = chartWidth(el);
      opts.height = 220;
      charts[id] = { key, u: new uPlot(opts, data, el) };
    } else {
      c.u.setData(data);
    }
  }

  const timeAxis = { label: "time since psd started", values: (u, vals) => vals.map(duration) };
  const versionAxis = { label: "model version", values: (u, vals) => vals.map(count) };

  function line(label, stroke, extra) {
    return Object.assign({ label, stroke, width: 1.5, spanGaps: true, points: { show: false } }, extra || {});
  }

  function joined(tables) {
    return tables.length ? uPlot.join(tables) : [[]];
  }

  function nonNull(a) {
    return a.filter((v) => v !== null).length;
  }

  /* A chart of one column of each worker's series against t or version. */
  function workerChart(id, part, column, xcol, yaxis, fmt) {
    const ws = hist.workers.filter((w) => w[part].t.length > 0);
    const tables = ws.map((w) => [w[part][xcol], w[part][column]]);
    const points = {};
    for (const w of ws) points["worker " + w.shard] = nonNull(w[part][column]);
    const key = part + column + xcol + ws.map((w) => w.shard).join(",");
    plot(id, key, () => ({
      scales: { x: { time: false } },
      axes: [xcol === "t" ? timeAxis : versionAxis, Object.assign({ size: 60, values: (u, v) => v.map(fmt) }, yaxis)],
      series: [{ label: xcol === "t" ? "time" : "version", value: (u, v) => (xcol === "t" ? duration(v) : count(v)) }]
        .concat(ws.map((w) => line("worker " + w.shard, color(w.shard), { value: (u, v) => fmt(v) }))),
      plugins: xcol === "t" ? [eventLines()] : [],
    }), joined(tables), points);
  }

  function psdChart(id, columns, labels, colors, fmt, yaxis) {
    const p = hist.psd;
    const points = {};
    columns.forEach((c, i) => (points[labels[i]] = nonNull(p[c])));
    plot(id, "psd" + columns.join(), () => ({
      scales: { x: { time: false } },
      axes: [timeAxis, Object.assign({ size: 70, values: (u, v) => v.map(fmt) }, yaxis || {})],
      series: [{ label: "time", value: (u, v) => duration(v) }]
        .concat(columns.map((c, i) => line(labels[i], colors[i], { value: (u, v) => fmt(v), dash: i ? [5, 3] : [] }))),
      plugins: [eventLines()],
    }), [p.t].concat(columns.map((c) => p[c])), points);
  }

  /* The embedding tables: per table a chart of the rows it holds and its
   * memory, and one of the rows pulled and pushed per second. */
  function tableCharts() {
    const tabs = hist.tables || [];
    $("tables-section").hidden = tabs.length === 0;
    const box = $("tables");
    const ids = [];
    tabs.forEach((tb, i) => {
      const p = tb.series;
      for (const kind of ["rows", "rates"]) {
        const id = "chart-table-" + i + "-" + kind;
        ids.push(id);
        let el = $(id);
        if (!el || el.dataset.table !== tb.name) {
          if (el) {
            if (charts[id]) charts[id].u.destroy();
            delete charts[id];
            el.remove();
          }
          el = document.createElement("div");
          el.className = "chart";
          el.id = id;
          el.dataset.table = tb.name;
          const h = document.createElement("h3");
          h.textContent = "table " + tb.name + (kind === "rows" ? ": rows held and memory" : ": rows pulled and pushed per second");
          el.appendChild(h);
          box.appendChild(el);
        }
      }
      const rowsId = "chart-table-" + i + "-rows", ratesId = "chart-table-" + i + "-rates";
      plot(rowsId, "table-rows" + tb.name, () => ({
        scales: { x: { time: false }, rows: {}, mem: {} },
        axes: [timeAxis, { scale: "rows", size: 70, values: (u, v) => v.map(count) },
          { scale: "mem", side: 1, size: 70, grid: { show: false }, values: (u, v) => v.map(bytes) }],
        series: [{ label: "time", value: (u, v) => duration(v) },
          line("rows", "#1a73e8", { scale: "rows", value: (u, v) => count(v) }),
          line("memory", "#188038", { scale: "mem", dash: [5, 3], value: (u, v) => bytes(v) })],
        plugins: [eventLines()],
      }), [p.t, p.rows, p.bytes], { rows: nonNull(p.rows), memory: nonNull(p.bytes) });
      const rate = (v) => (v === null ? "–" : sig(v));
      plot(ratesId, "table-rates" + tb.name, () => ({
        scales: { x: { time: false } },
        axes: [timeAxis, { size: 70, values: (u, v) => v.map(rate) }],
        series: [{ label: "time", value: (u, v) => duration(v) },
          line("pulled/s", "#e8710a", { value: (u, v) => rate(v) }),
          line("pushed/s", "#9334e6", { dash: [5, 3], value: (u, v) => rate(v) })],
        plugins: [eventLines()],
      }), [p.t, p.rows_pulled_per_second, p.rows_pushed_per_second],
      { "pulled/s": nonNull(p.rows_pulled_per_second), "pushed/s": nonNull(p.rows_pushed_per_second) });
    });
    for (const el of [...box.children]) {
      if (ids.includes(el.id)) continue;
      if (charts[el.id]) charts[el.id].u.destroy();
      delete charts[el.id];
      el.remove();
    }
  }

  function stalenessChart() {
    const st = job.staleness;
    const labels = st.bounds.map((b) => "≤" + b).concat([">" + st.bounds[st.bounds.length - 1]]);
    const xs = labels.map((l, i) => i);
    plot("chart-staleness", "staleness" + labels.length, () => ({
      scales: { x: { time: false, range: [-0.5, labels.length - 0.5] } },
      axes: [
        { label: "versions between a push's base and the model", values: (u, vals) => vals.map((v) => labels[v] || ""),
          splits: () => xs },
        { size: 70, values: (u, v) => v.map(count) },
      ],
      series: [
        { label: "staleness", value: (u, v) => (v === null ? "–" : labels[v]) },
        { label: "pushes", stroke: "#1a73e8", fill: "rgba(26,115,232,0.35)", width: 1,
          paths: uPlot.paths.bars({ size: [0.7, 60] }), points: { show: false } },
      ],
    }), [xs, st.counts], { pushes: st.counts.reduce((a, b) => a + b, 0) });
  }

  function lrChart() {
    const p = hist.psd;
    const c = job.lr_curve;
    const tables = [[p.version, p.lr]];
    if (c.version.length) tables.push([c.version, c.lr]);
    plot("chart-lr", "lr" + tables.length, () => ({
      scales: { x: { time: false } },
      axes: [versionAxis, { size: 70, values: (u, v) => v.map(sig) }],
      series: [{ label: "version", value: (u, v) => count(v) }, line("applied", "#1a73e8", { width: 2 })]
        .concat(tables.length > 1 ? [line("schedule", "#9aa0a6", { dash: [6, 4] })] : []),
    }), joined(tables), { applied: nonNull(p.lr), schedule: c.lr.length });
  }

  function renderCharts() {
    const pct = (v) => (v === null ? "–" : (100 * v).toFixed(1) + "%");
    const loss = (v) => (v === null ? "–" : sig(v));
    workerChart("chart-loss-time", "train", "loss", "t", {}, loss);
    workerChart("chart-loss-version", "train", "loss", "version", {}, loss);
    workerChart("chart-acc-time", "eval", "accuracy", "t", {}, pct);
    workerChart("chart-acc-version", "eval", "accuracy", "version", {}, pct);
    const rate = (v) => (v === null ? "–" : sig(v));
    psdChart("chart-pushes", ["pushes_per_second", "pulls_per_second"], ["pushes/s", "pulls/s"],
      ["#1a73e8", "#e8710a"], rate);
    psdChart("chart-bytes", ["bytes_in_per_second", "bytes_out_per_second"], ["in/s", "out/s"],
      ["#188038", "#d01884"], (v) => (v === null ? "–" : bytes(v)));
    const ms = (v) => (v === null ? "–" : sig(1000 * v) + " ms");
    psdChart("chart-rounds", ["round_seconds_p50", "round_seconds_p99"], ["p50", "p99"], ["#1a73e8", "#b00020"], ms);
    $("rounds-note").textContent = job.rounds ? "" : " (none: " + job.mode + " has no rounds)";
    stalenessChart();
    lrChart();
    tableCharts();
    renderEvents();
  }

  /* ---- the loop ---------------------------------------------------------------- */

  async function refresh() {
    try {
      job = await get("/api/job");
      renderJob();
      renderReplicas();
      renderParts();
      const now = Date.now();
      if (now - lastHistory >= HISTORY_MS || !hist) {
        hist = await get("/api/history");
        lastHistory = now;
        renderCharts();
      }
      setStatus("live · model version " + count(job.version));
    } catch (e) {
      setStatus("psd does not answer (" + e.message + "); showing what it last sent", true);
    }
    setTimeout(refresh, JOB_MS);
  }

  window.addEventListener("resize", () => {
    for (const id in charts) charts[id].u.setSize({ width: chartWidth($(id)), height: 220 });
  });

  refresh();
})();
