// absflow dashboard: polls the REST API (/api/...) and draws what the job manager
// publishes. Everything it loads ships in the package (static/vendor): no CDN.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const pollMs = Math.max(200, parseInt(params.get("poll") || "1000", 10) || 1000);
  const state = { job: params.get("job"), plan: null, cy: null, chart: null, cpIds: "" };
  window.absflow = state;  // for tests and the curious: state.cy is the graph

  const $ = (sel) => document.querySelector(sel);
  const fmt = (v, digits) => v === null || v === undefined ? "–"
    : typeof v === "number" ? v.toLocaleString(undefined, { maximumFractionDigits: digits ?? 1 }) : String(v);
  const pct = (v) => v === null || v === undefined ? "–" : (100 * v).toFixed(0) + " %";
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  async function get(path) {
    const sep = path.includes("?") ? "&" : "?";
    const perJob = state.job && path !== "jobs";  // /api/jobs lists them all
    const url = "/api/" + path + (perJob ? sep + "job=" + encodeURIComponent(state.job) : "");
    const res = await fetch(url, { cache: "no-store" });
    const body = await res.json();
    if (!res.ok) throw new Error(body.error || res.statusText);
    return body;
  }

  function setRows(tbody, rows) {
    tbody.innerHTML = rows.join("");
  }

  // -- the graph ---------------------------------------------------------------------
  function drawGraph(plan) {
    const els = [];
    for (const c of plan.chains) {
      els.push({ data: { id: "chain" + c.id, label: c.steps.join(" → ") }, classes: "chain" });
    }
    for (const t of plan.tasks) {
      els.push({ data: { id: "t" + t.index, parent: "chain" + t.chain, label: t.task_id }, classes: "task" });
    }
    const seen = new Set();
    for (const ch of plan.channels) {
      const id = "c" + ch.source_task + "-" + ch.target_task;
      if (seen.has(id)) continue;  // one line per task pair
      seen.add(id);
      els.push({ data: { id, source: "t" + ch.source_task, target: "t" + ch.target_task, label: ch.partitioning },
                 classes: ch.back_edge ? "back-edge" : "" });
    }
    state.cy = cytoscape({
      container: $("#graph"), elements: els,
      layout: { name: "dagre", rankDir: "LR", nodeSep: 12, rankSep: 70 },
      style: [
        { selector: "node.chain", style: { label: "data(label)", "text-valign": "top", "font-size": 11,
          "background-color": "#f3f4f6", "border-color": "#9ca3af", "border-width": 1, shape: "round-rectangle" } },
        { selector: "node.task", style: { label: "data(label)", "font-size": 10, "text-valign": "center",
          width: 120, height: 34, shape: "round-rectangle", "background-color": "#d1d5db", "text-wrap": "wrap",
          "border-width": 1, "border-color": "#6b7280" } },
        { selector: "edge", style: { width: 1.2, "curve-style": "bezier", "target-arrow-shape": "triangle",
          "line-color": "#9ca3af", "target-arrow-color": "#9ca3af" } },
        { selector: "edge.back-edge", style: { "line-style": "dashed", "line-color": "#dc2626",
          "target-arrow-color": "#dc2626", width: 2 } },
      ],
    });
  }

  function colour(t) {
    // busy share -> green, backpressure share -> red, the rest (idle) grey
    const b = t.busy_share || 0, p = t.backpressure_share || 0;
    const r = Math.round(209 + (239 - 209) * p - 150 * b * (1 - p));
    const g = Math.round(213 - 120 * p + 20 * b);
    const bl = Math.round(219 - 150 * p - 110 * b);
    return `rgb(${Math.max(0, r)},${Math.max(0, g)},${Math.max(0, bl)})`;
  }

  function updateGraph(tasks) {
    if (!state.cy) return;
    state.cy.batch(() => {
      for (const t of tasks) {
        const n = state.cy.getElementById("t" + t.index);
        if (!n.nonempty()) continue;
        n.style("background-color", colour(t));
        n.data("label", `${t.task_id}\n${fmt(t.records_in_per_second, 0)}/s bp ${pct(t.backpressure_share)}`);
      }
    });
  }

  // -- tables ------------------------------------------------------------------------
  function showJob(job) {
    $("#job-name").textContent = job.name;
    const s = $("#job-state");
    s.textContent = job.state + (job.attempt ? ` (attempt ${job.attempt})` : "");
    s.className = "state " + job.state;
    const opt = $("#job-select").selectedOptions[0];
    if (opt) opt.textContent = `${job.id} (${job.state})`;
    $("#summary").innerHTML = [
      `records in <b>${fmt(job.records_in, 0)}</b>`, `out <b>${fmt(job.records_out, 0)}</b>`,
      `${fmt(job.duration_seconds)} s`, `checkpoints <b>${job.checkpoints_completed}</b> (${job.checkpoints_failed} failed)`,
      `restarts <b>${job.restarts}</b>`, `tasks ${job.tasks}`,
    ].map((x) => `<span>${x}</span>`).join("");
    const e = $("#error");
    e.hidden = !job.error;
    e.textContent = job.error || "";
  }

  function showTasks(tasks) {
    setRows($("#tasks tbody"), tasks.map((t) => `<tr data-task="${esc(t.task_id)}">
      <td>${esc(t.task_id)}</td><td>${t.state}</td><td>${esc(t.host || "–")}</td>
      <td>${fmt(t.records_in_per_second, 0)}</td><td>${fmt(t.records_out_per_second, 0)}</td>
      <td>${fmt(t.records_in, 0)}</td><td>${fmt(t.records_out, 0)}</td><td>${fmt(t.bytes_in, 0)}</td><td>${fmt(t.bytes_out, 0)}</td>
      <td>${fmt(t.backpressure_seconds, 2)} s (${pct(t.backpressure_share)})</td><td>${pct(t.busy_share)}</td>
      <td>${fmt(t.input_queue, 0)}</td><td>${fmt(t.output_queue, 0)}</td><td>${fmt(t.watermark)}</td>
      <td>${fmt(t.state_keys, 0)}</td><td>${fmt(t.state_bytes, 0)}</td></tr>`));
  }

  function showCheckpoints(cp) {
    const rows = cp.completed.slice().reverse();
    $("#cp-summary").textContent = cp.pending.length ? `pending: ${cp.pending.join(", ")}` : "";
    setRows($("#checkpoints tbody"), rows.map((c) => `<tr data-checkpoint="${c.checkpoint_id}">
      <td>${c.checkpoint_id}${c.final ? " (final)" : ""}</td><td>${c.attempt}</td><td>${esc(c.mode)}</td>
      <td>${fmt(c.duration_ms)}</td><td>${fmt(c.state_bytes, 0)}</td><td>${fmt(c.full_state_bytes, 0)}</td><td>${fmt(c.channel_state_bytes, 0)}</td>
      <td>${fmt(c.backedge_bytes, 0)}</td><td>${fmt(c.max_alignment_ms)}</td><td>${fmt(c.max_start_delay_ms)}</td>
      <td title="at ${esc(c.critical_task)}, the task written last">${fmt(c.queueing_ms)} / ${fmt(c.alignment_ms)} / ${fmt(c.write_ms)}</td>
      <td class="left"><details><summary>${Object.keys(c.tasks).length} tasks</summary>${Object.entries(c.tasks).map(([k, v]) => `${esc(k)} ${fmt(v.alignment_ms)} / ${fmt(v.start_delay_ms)}`).join("<br>")}</details></td></tr>`));
    setRows($("#failed-checkpoints tbody"), cp.failed.slice().reverse().map((f) => `<tr>
      <td>${f.checkpoint_id}</td><td>${fmt(f.attempt)}</td><td>${esc(f.reason)}</td><td class="left">${esc(f.detail)}</td></tr>`));
    const ids = cp.completed.map((c) => c.checkpoint_id).join(",");
    if (ids === state.cpIds) return;
    state.cpIds = ids;
    const data = [cp.completed.map((c) => c.checkpoint_id), cp.completed.map((c) => c.duration_ms),
                  cp.completed.map((c) => c.state_bytes / 1024)];
    if (!state.chart) {
      state.chart = new uPlot({
        width: Math.max(300, $("#cp-chart").clientWidth || 600), height: 180,
        scales: { x: { time: false } },
        axes: [{ label: "checkpoint" }, { label: "ms", scale: "y" }, { side: 1, scale: "kib", label: "KiB", grid: { show: false } }],
        series: [{ label: "id" }, { label: "duration ms", stroke: "#2563eb", scale: "y" },
                 { label: "state KiB", stroke: "#059669", scale: "kib" }],
      }, data, $("#cp-chart"));
    } else {
      state.chart.setData(data);
    }
  }

  function showRestarts(job, restarts) {
    setRows($("#restarts tbody"), restarts.map((r) => `<tr class="restart-row">
      <td>${r.attempt}</td><td>${esc(r.cause)}</td><td class="left">${esc(r.reason)}</td>
      <td>${r.restored_checkpoint === null ? "start" : "checkpoint " + r.restored_checkpoint}</td>
      <td>${fmt(r.recovery_seconds, 2)}</td></tr>`));
    const tl = $("#timeline");
    const t0 = job.started_at, span = Math.max(job.duration_seconds, 0.001);
    const x = (t) => Math.min(100, Math.max(0, (100 * (t - t0)) / span));
    tl.innerHTML = `<div class="run" style="left:0;width:100%"></div>` + restarts.map((r) => {
      const end = r.resumed_at || (t0 + span);
      return `<div class="restart" title="${esc(r.cause + ": " + r.reason)}" style="left:${x(r.failed_at)}%;width:${x(end) - x(r.failed_at)}%"></div>
        <div class="label" style="left:${x(r.failed_at)}%">${esc(r.cause)} ${r.recovery_seconds ? fmt(r.recovery_seconds, 2) + " s" : ""}</div>`;
    }).join("");
  }

  function showIteration(it) {
    const section = $("#iteration");
    section.hidden = !it;
    if (!it) return;
    $("#iteration-summary").innerHTML = [
      `phase <b>${esc(it.phase)}</b>`, `superstep <b>${it.superstep}</b>`,
      `done <b>${it.supersteps_done}</b>`, `started in all attempts ${it.supersteps_started}`,
      `aggregate <b>${fmt(it.aggregate, 6)}</b>`, it.converged ? "converged" : "",
      `re-run ${it.rerun}`,
    ].filter((x) => x).map((x) => `<span>${x}</span>`).join("");
    const seconds = Object.fromEntries(it.superstep_seconds.map((s) => [s.superstep, s.seconds]));
    const checkpoint = Object.fromEntries(it.checkpoints.map((c) => [c.superstep, c.checkpoint_id]));
    setRows($("#supersteps tbody"), it.aggregates.slice(-20).reverse().map((a) => `<tr data-superstep="${a.superstep}">
      <td>${a.superstep}</td><td>${fmt(a.aggregate, 6)}</td><td>${fmt(seconds[a.superstep], 3)}</td>
      <td>${checkpoint[a.superstep] === undefined ? "" : checkpoint[a.superstep]}</td></tr>`));
    setRows($("#superstep-recoveries tbody"), it.recoveries.map((r) => `<tr>
      <td>${r.failed_during}</td><td>${r.resumed_from}</td><td>${r.rerun}</td></tr>`));
  }

  function showConfig(cfg) {
    setRows($("#config tbody"), Object.entries(cfg.config).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(fmt(v, 6))}</td></tr>`));
  }

  // -- polling -----------------------------------------------------------------------
  async function start() {
    const jobs = (await get("jobs")).jobs;
    if (!state.job && jobs.length) state.job = jobs[jobs.length - 1].id;
    $("#job-select").innerHTML = jobs.map((j) => `<option value="${esc(j.id)}" ${j.id === state.job ? "selected" : ""}>${esc(j.id)} (${esc(j.state)})</option>`).join("");
    state.plan = await get("plan");
    drawGraph(state.plan);
    showConfig(await get("config"));
  }

  async function poll() {
    try {
      if (!state.plan) await start();
      const o = await get("overview");
      showJob(o.job); showTasks(o.tasks); updateGraph(o.tasks);
      showCheckpoints(o.checkpoints); showRestarts(o.job, o.restarts); showIteration(o.iteration);
      state.lastPoll = Date.now();
    } catch (err) {
      const e = $("#error");
      e.hidden = false;
      e.textContent = "dashboard: " + err.message;
    }
    setTimeout(poll, pollMs);
  }

  $("#job-select").addEventListener("change", (ev) => {
    const u = new URL(location.href);
    u.searchParams.set("job", ev.target.value);
    location.href = u.toString();
  });
  poll();
})();
