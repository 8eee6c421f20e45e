// lockstep's run timeline: draws the model that sim/timeline/model.rs built from a trace (embedded as JSON in the
// page, with the trace's text for the hover), on a canvas, lane by lane, only what is in view. No network.
(function () {
  'use strict';

  var pageError = document.getElementById('page-error');
  window.addEventListener('error', function (event) {
    pageError.hidden = false;
    pageError.textContent = 'timeline error: ' + event.message;
  });

  var LABEL_W = 230;
  var LANE_H = 22;
  var GROUPS = ['node', 'operation', 'allocation', 'row'];
  var GROUP_TITLES = { node: 'nodes and faults', operation: 'operations', allocation: 'allocations', row: 'rows and leases' };
  var FAULT_COLORS = {
    down: '#d64545', pause: '#e0a030', partition: '#7b61c9', isolate: '#5b4aa8', drift: '#2c9bb3',
    degrade: '#8a8f9c', 'lost-replies': '#c2569b', buggify: '#b38b2c'
  };
  var HOLDER_COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#9c755f', '#e15759',
    '#86bcb6', '#d37295', '#a0cbe8', '#8cd17d'];

  var data = JSON.parse(document.getElementById('timeline-data').textContent);
  var lines = data.trace.split('\n');
  var lanes = data.lanes;
  var it = data.items;
  var kinds = data.kinds;
  var count = it.lane.length;

  // Items per lane (already sorted by lane, then start), and each lane's longest item (for the window search).
  var laneItems = lanes.map(function () { return []; });
  var laneLongest = new Float64Array(lanes.length);
  for (var i = 0; i < count; i++) {
    laneItems[it.lane[i]].push(i);
    var span = it.end[i] - it.start[i];
    if (span > laneLongest[it.lane[i]]) laneLongest[it.lane[i]] = span;
  }
  var laneOps = lanes.map(function (lane) { return new Set(lane.ops); });

  var end = Math.max(data.end, 1);
  var state = {
    t0: 0, t1: end,
    op: null,            // an operation id: its lanes and the nodes
    rows: null,          // a Set of row ids (rows, operations and allocations of those rows) and the nodes
    groups: new Set(GROUPS),
    hover: -1,
    focused: -1          // the index of the violation in focus
  };
  var named = new Set();  // lanes the focused violation names
  var visible = [];       // the rows of the page: {header: group} or {lane: index}

  var scroller = document.getElementById('scroller');
  var sizer = document.getElementById('sizer');
  var labels = document.getElementById('labels');
  var plot = document.getElementById('plot');
  var axis = document.getElementById('axis');
  var markers = document.getElementById('markers');
  var tooltip = document.getElementById('tooltip');
  var readout = document.getElementById('readout');
  var ctx = plot.getContext('2d');
  var axisCtx = axis.getContext('2d');

  // ---- header: title, verdict, checkers, summary, legend ----
  var verdict = document.getElementById('verdict');
  verdict.textContent = data.verdict ? data.verdict.toUpperCase() : 'trace only';
  verdict.className = data.verdict || 'unknown';
  var checkerList = document.getElementById('checkers');
  (data.checkers || []).forEach(function (checker, index) {
    var li = document.createElement('li');
    li.className = checker.ok ? 'ok' : 'failed';
    li.dataset.checker = checker.name;
    li.appendChild(document.createTextNode(checker.name + (checker.ok ? '' : ' FAILED: ')));
    if (!checker.ok) {
      var message = document.createElement('span');
      message.className = 'message';
      message.textContent = checker.message;
      li.appendChild(message);
      var show = document.createElement('button');
      show.type = 'button';
      show.className = 'show-violation';
      show.textContent = checker.at === null ? 'show its rows' : 'show at ' + seconds(checker.at) + ' s';
      show.addEventListener('click', function () { focusViolation(index); });
      li.appendChild(show);
    }
    checkerList.appendChild(li);
  });
  if (data.panic) {
    var panic = document.createElement('li');
    panic.className = 'failed';
    panic.textContent = 'the run panicked: ' + data.panic;
    checkerList.appendChild(panic);
  }
  if (data.summary) {
    document.getElementById('summary').textContent = data.summary;
  } else {
    document.getElementById('summary-box').hidden = true;
  }
  var legend = document.getElementById('legend');
  var legendEntries = [['killed / down', FAULT_COLORS.down], ['paused', FAULT_COLORS.pause],
    ['partitioned', FAULT_COLORS.partition], ['isolated', FAULT_COLORS.isolate], ['clock drift', FAULT_COLORS.drift],
    ['degraded links', FAULT_COLORS.degrade], ['lost replies', FAULT_COLORS['lost-replies']],
    ['buggify', FAULT_COLORS.buggify], ['lease (colour: holder)', HOLDER_COLORS[0]], ['takeover \u25BC', '#e07b00'],
    ['stale apply turned away \u00D7', '#e07b00'], ['stale write \u00D7', '#c81e1e'], ['process', '#2f6f3e'],
    ['violation', '#c81e1e']];
  legendEntries.forEach(function (entry) {
    var span = document.createElement('span');
    var swatch = document.createElement('i');
    swatch.style.background = entry[1];
    span.appendChild(swatch);
    span.appendChild(document.createTextNode(entry[0]));
    legend.appendChild(span);
  });
  legend.appendChild(document.createTextNode('drag: pan \u00B7 Ctrl + wheel: zoom \u00B7 click a label: filter \u00B7 Esc: clear'));

  // ---- operation filter options ----
  var opSelect = document.getElementById('op-filter');
  lanes.forEach(function (lane) {
    if (lane.group !== 'operation') return;
    var option = document.createElement('option');
    option.value = lane.key;
    option.textContent = 'op=' + lane.key + (lane.note ? ' ' + lane.note : '');
    opSelect.appendChild(option);
  });
  var rowInput = document.getElementById('row-filter');

  // ---- filtering ----
  function laneShown(index) {
    var lane = lanes[index];
    if (!state.groups.has(lane.group)) return false;
    if (lane.group === 'node') return true;
    if (state.op !== null) return laneOps[index].has(state.op);
    if (state.rows !== null) {
      var id = lane.group === 'allocation' ? Number(lane.key.split('.')[0]) : Number(lane.key);
      return state.rows.has(id);
    }
    return true;
  }

  function itemShown(index) {
    var op = it.op[index];
    return state.op === null || op === null || op === state.op;
  }

  function relayout() {
    visible = [];
    GROUPS.forEach(function (group) {
      var rows = [];
      for (var i = 0; i < lanes.length; i++) {
        if (lanes[i].group === group && laneShown(i)) rows.push({ lane: i });
      }
      if (rows.length) {
        visible.push({ header: group, count: rows.length });
        Array.prototype.push.apply(visible, rows);
      }
    });
    sizer.style.height = (visible.length * LANE_H + LANE_H) + 'px';
    scroller.scrollTop = Math.min(scroller.scrollTop, Math.max(0, visible.length * LANE_H - scroller.clientHeight));
    opSelect.value = state.op === null ? '' : String(state.op);
    if (document.activeElement !== rowInput) {
      rowInput.value = state.rows === null ? '' : Array.from(state.rows).join(', ');
    }
    // At once, not at the next frame: the lane labels are in the DOM when the filter's event returns.
    render();
  }

  function setOperation(op) {
    state.op = op;
    state.rows = null;
    relayout();
  }

  function setRows(rows) {
    state.rows = rows && rows.length ? new Set(rows) : null;
    state.op = null;
    relayout();
  }

  function clearFilter() {
    state.op = null;
    state.rows = null;
    state.focused = -1;
    named = new Set();
    relayout();
  }

  opSelect.addEventListener('change', function () {
    setOperation(opSelect.value === '' ? null : Number(opSelect.value));
  });
  rowInput.addEventListener('change', function () {
    var ids = rowInput.value.split(/[\s,]+/).filter(function (id) { return /^\d+$/.test(id); }).map(Number);
    setRows(ids);
  });
  document.getElementById('clear-filter').addEventListener('click', clearFilter);
  Array.prototype.forEach.call(document.querySelectorAll('.group-toggle'), function (box) {
    box.addEventListener('change', function () {
      if (box.checked) state.groups.add(box.value); else state.groups.delete(box.value);
      relayout();
    });
  });

  // ---- violations ----
  function focusViolation(index) {
    var checker = data.checkers[index];
    state.focused = index;
    var ids = checker.rows.concat(checker.ops);
    named = new Set();
    lanes.forEach(function (lane, laneIndex) {
      if ((lane.group === 'row' && checker.rows.indexOf(Number(lane.key)) >= 0) ||
          (lane.group === 'operation' && checker.ops.indexOf(Number(lane.key)) >= 0)) named.add(laneIndex);
    });
    if (ids.length) setRows(ids); else relayout();
    if (checker.at !== null) {
      var width = Math.max((state.t1 - state.t0) / 4, 2e6);
      zoomTo(checker.at - width * 0.7, checker.at + width * 0.3);
    }
  }

  function placeMarkers() {
    markers.textContent = '';
    var width = axis.clientWidth;
    (data.checkers || []).forEach(function (checker, index) {
      if (checker.ok || checker.at === null) return;
      var marker = document.createElement('div');
      marker.className = 'violation-marker';
      marker.dataset.checker = checker.name;
      marker.title = checker.name + ' at ' + seconds(checker.at) + ' s: ' + checker.message;
      marker.textContent = '!';
      var x = xOf(checker.at);
      if (x < 0 || x > width) marker.classList.add('offscreen');
      marker.style.left = x + 'px';
      marker.addEventListener('click', function () { focusViolation(index); });
      markers.appendChild(marker);
    });
  }

  // ---- geometry ----
  function scale() { return plot.clientWidth / (state.t1 - state.t0); }
  function xOf(t) { return (t - state.t0) * scale(); }
  function tOf(x) { return state.t0 + x / scale(); }

  function zoomTo(t0, t1) {
    var minSpan = 20;
    var margin = end * 0.05;
    if (t1 - t0 < minSpan) { var mid = (t0 + t1) / 2; t0 = mid - minSpan / 2; t1 = mid + minSpan / 2; }
    if (t1 - t0 > end + 2 * margin) { t0 = -margin; t1 = end + margin; }
    if (t0 < -margin) { t1 += -margin - t0; t0 = -margin; }
    if (t1 > end + margin) { t0 -= t1 - end - margin; t1 = end + margin; }
    state.t0 = t0;
    state.t1 = t1;
    draw();
  }

  function zoomAround(t, factor) {
    zoomTo(t - (t - state.t0) * factor, t + (state.t1 - t) * factor);
  }

  function seconds(us) {
    return (us / 1e6).toFixed(3);
  }

  // ---- drawing ----
  function resize() {
    var ratio = window.devicePixelRatio || 1;
    var width = Math.max(100, scroller.clientWidth - LABEL_W);
    var height = Math.max(50, scroller.clientHeight);
    [[plot, ctx, height], [axis, axisCtx, 26]].forEach(function (entry) {
      entry[0].width = Math.round(width * ratio);
      entry[0].height = Math.round(entry[2] * ratio);
      entry[0].style.width = width + 'px';
      entry[0].style.height = entry[2] + 'px';
      entry[1].setTransform(ratio, 0, 0, ratio, 0, 0);
    });
    draw();
  }

  // Scrolling, zooming and hovering redraw at the next frame, once however many events came.
  var pending = false;
  function draw() {
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(function () {
      pending = false;
      render();
    });
  }

  function render() {
    var width = plot.clientWidth;
    var height = plot.clientHeight;
    var top = scroller.scrollTop;
    var first = Math.max(0, Math.floor(top / LANE_H));
    var last = Math.min(visible.length - 1, Math.ceil((top + height) / LANE_H));
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    labels.textContent = '';
    for (var row = first; row <= last; row++) {
      var entry = visible[row];
      var y = row * LANE_H - top;
      if (entry.header) {
        ctx.fillStyle = '#eef0f4';
        ctx.fillRect(0, y, width, LANE_H);
        var header = document.createElement('div');
        header.className = 'group-header';
        header.style.top = y + 'px';
        header.textContent = GROUP_TITLES[entry.header] + ' (' + entry.count + ')';
        labels.appendChild(header);
        continue;
      }
      if (row % 2) {
        ctx.fillStyle = '#fafbfc';
        ctx.fillRect(0, y, width, LANE_H);
      }
      if (named.has(entry.lane)) {
        ctx.fillStyle = 'rgba(200, 30, 30, 0.07)';
        ctx.fillRect(0, y, width, LANE_H);
      }
      labels.appendChild(laneLabel(entry.lane, y));
      drawLane(entry.lane, y, width);
    }
    drawTimeGrid(width, height);
    drawAxis(width);
    placeMarkers();
    readout.textContent = seconds(Math.max(0, state.t0)) + ' s \u2013 ' + seconds(state.t1) + ' s of ' +
      seconds(end) + ' s; ' + (visible.length - visible.filter(function (v) { return v.header; }).length) +
      ' of ' + lanes.length + ' lanes';
  }

  function laneLabel(index, y) {
    var lane = lanes[index];
    var div = document.createElement('div');
    div.className = 'lane-label' + (named.has(index) ? ' named' : '');
    div.style.top = y + 'px';
    div.dataset.group = lane.group;
    div.dataset.key = lane.key;
    div.dataset.ops = lane.ops.join(' ');
    var name = lane.group === 'operation' ? 'op=' + lane.key : lane.group === 'row' ? 'row ' + lane.key :
      lane.group === 'allocation' ? 'alloc ' + lane.key : lane.key;
    div.appendChild(document.createTextNode(name));
    if (lane.note) {
      var note = document.createElement('span');
      note.className = 'note';
      note.textContent = lane.note;
      div.appendChild(note);
    }
    div.title = lane.group === 'node' ? name : name + ': click to show only it';
    div.addEventListener('click', function () {
      if (lane.group === 'operation') setOperation(Number(lane.key));
      else if (lane.group === 'row') setRows([Number(lane.key)]);
      else if (lane.group === 'allocation') setRows([Number(lane.key.split('.')[0])]);
    });
    return div;
  }

  // The items of `lane` that may overlap [t0, t1]: from the first whose start is past t0 minus the lane's longest.
  function itemsInView(lane, t0, t1, visit) {
    var list = laneItems[lane];
    var from = t0 - laneLongest[lane];
    var lo = 0;
    var hi = list.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (it.start[list[mid]] < from) lo = mid + 1; else hi = mid;
    }
    for (var k = lo; k < list.length; k++) {
      var index = list[k];
      if (it.start[index] > t1) break;
      if (it.end[index] < t0 || !itemShown(index)) continue;
      visit(index);
    }
  }

  function holderColor(index) {
    var holder = it.holder[index];
    return holder === null ? '#4e79a7' : HOLDER_COLORS[holder % HOLDER_COLORS.length];
  }

  function opColor(op) {
    if (op === null) return '#6b7384';
    return 'hsl(' + ((op * 67) % 360) + ', 45%, 62%)';
  }

  function drawLane(lane, y, width) {
    var pad = 1 / scale();
    itemsInView(lane, state.t0 - pad * 8, state.t1 + pad * 8, function (index) {
      var kind = kinds[it.kind[index]];
      var x0 = xOf(it.start[index]);
      var x1 = Math.max(xOf(it.end[index]), x0 + 1);
      var left = Math.max(x0, -2);
      var right = Math.min(x1, width + 2);
      switch (kind) {
        case 'drift': case 'degrade': case 'lost-replies': case 'buggify':
          // Faults on the node's clock or the network around it: a band at the lane's foot, under the others.
          ctx.globalAlpha = 0.45;
          ctx.fillStyle = FAULT_COLORS[kind];
          ctx.fillRect(left, y + LANE_H - 8, right - left, 7);
          ctx.globalAlpha = 1;
          break;
        case 'down': case 'pause': case 'partition': case 'isolate':
          ctx.globalAlpha = 0.35;
          ctx.fillStyle = FAULT_COLORS[kind];
          ctx.fillRect(left, y + 1, right - left, LANE_H - 2);
          ctx.globalAlpha = 1;
          ctx.fillStyle = FAULT_COLORS[kind];
          ctx.fillRect(left, y + LANE_H - 4, right - left, 3);
          text(it.label[index], left, right, y + LANE_H / 2 - 1, '#1d2330');
          break;
        case 'event':
          ctx.fillStyle = '#8a8f9c';
          ctx.fillRect(x0 - 0.5, y + 5, 1.5, LANE_H - 10);
          break;
        case 'op-state':
          ctx.fillStyle = '#1d2330';
          ctx.fillRect(x0 - 1, y + 2, 2, LANE_H - 4);
          break;
        case 'incarnation':
          ctx.fillStyle = Number(it.label[index].split(' ')[1]) % 2 ? '#cfe0f5' : '#dbeedd';
          ctx.fillRect(left, y + 2, right - left, LANE_H - 4);
          ctx.strokeStyle = '#8aa2c0';
          ctx.strokeRect(x0 + 0.5, y + 2.5, x1 - x0 - 1, LANE_H - 5);
          text(it.label[index], left, right, y + LANE_H / 2, '#1d2330');
          break;
        case 'gang-wait':
          ctx.fillStyle = '#e0a030';
          ctx.fillRect(left, y + LANE_H - 6, right - left, 4);
          break;
        case 'job':
          ctx.fillStyle = opColor(it.op[index]);
          ctx.fillRect(left, y + 2, right - left, 9);
          ctx.fillStyle = /^completed/.test(it.state[index]) ? '#2f8f46' : /^failed/.test(it.state[index]) ? '#c81e1e' : '#6b7384';
          ctx.fillRect(Math.max(x1 - 2, x0), y + 2, 2, 9);
          text(it.label[index], left, right, y + 6.5, '#1d2330');
          break;
        case 'process':
          ctx.fillStyle = /^exit 0$/.test(it.state[index]) ? '#2f6f3e' : /^exit/.test(it.state[index]) ? '#a11a1a' :
            /killed/.test(it.state[index]) ? '#b86a00' : '#2f6f3e';
          ctx.fillRect(left, y + 13, right - left, 6);
          break;
        case 'lease':
          ctx.fillStyle = holderColor(index);
          ctx.globalAlpha = /^expired/.test(it.state[index]) ? 0.45 : 0.8;
          ctx.fillRect(left, y + 4, right - left, LANE_H - 8);
          ctx.globalAlpha = 1;
          text(it.label[index], left, right, y + LANE_H / 2, '#fff');
          break;
        case 'takeover':
          ctx.fillStyle = '#e07b00';
          ctx.beginPath();
          ctx.moveTo(x0 - 5, y + 1);
          ctx.lineTo(x0 + 5, y + 1);
          ctx.lineTo(x0, y + 8);
          ctx.fill();
          break;
        case 'stale-apply':
        case 'stale-write':
          var size = kind === 'stale-write' ? 6 : 4;
          ctx.strokeStyle = kind === 'stale-write' ? '#c81e1e' : '#e07b00';
          ctx.lineWidth = kind === 'stale-write' ? 2.5 : 1.5;
          ctx.beginPath();
          ctx.moveTo(x0 - size, y + LANE_H / 2 - size);
          ctx.lineTo(x0 + size, y + LANE_H / 2 + size);
          ctx.moveTo(x0 + size, y + LANE_H / 2 - size);
          ctx.lineTo(x0 - size, y + LANE_H / 2 + size);
          ctx.stroke();
          ctx.lineWidth = 1;
          break;
      }
      if (index === state.hover) {
        ctx.strokeStyle = '#1d2330';
        ctx.lineWidth = 1.5;
        ctx.strokeRect(Math.max(x0, -2) - 2, y + 1, Math.min(x1, width + 2) - Math.max(x0, -2) + 4, LANE_H - 2);
        ctx.lineWidth = 1;
      }
    });
  }

  function text(label, left, right, y, color) {
    if (!label || right - left < 30) return;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, 0, right - left, plot.clientHeight);
    ctx.clip();
    ctx.fillStyle = color;
    ctx.fillText(label, Math.max(left, 0) + 3, y);
    ctx.restore();
  }

  function tickStep(span, width) {
    var target = span / Math.max(1, width / 90);
    var step = Math.pow(10, Math.floor(Math.log10(target)));
    [1, 2, 5, 10].some(function (factor) {
      if (step * factor >= target) { step *= factor; return true; }
      return false;
    });
    return step;
  }

  function drawTimeGrid(width, height) {
    var step = tickStep(state.t1 - state.t0, width);
    ctx.strokeStyle = 'rgba(0, 0, 0, 0.06)';
    for (var t = Math.ceil(state.t0 / step) * step; t <= state.t1; t += step) {
      var x = Math.round(xOf(t)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, 0);
      ctx.lineTo(x, height);
      ctx.stroke();
    }
    (data.checkers || []).forEach(function (checker, index) {
      if (checker.ok || checker.at === null) return;
      var x = xOf(checker.at);
      ctx.fillStyle = index === state.focused ? 'rgba(200, 30, 30, 0.9)' : 'rgba(200, 30, 30, 0.55)';
      ctx.fillRect(x - 1, 0, 2, height);
    });
  }

  function drawAxis(width) {
    axisCtx.clearRect(0, 0, width, 26);
    axisCtx.font = '11px system-ui, sans-serif';
    axisCtx.fillStyle = '#4a5264';
    axisCtx.textBaseline = 'top';
    var step = tickStep(state.t1 - state.t0, width);
    var digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / 1e6))));
    for (var t = Math.ceil(state.t0 / step) * step; t <= state.t1; t += step) {
      var x = Math.round(xOf(t)) + 0.5;
      axisCtx.fillRect(x, 18, 1, 8);
      axisCtx.fillText((t / 1e6).toFixed(digits), x + 3, 6);
    }
  }

  // ---- hover ----
  function itemAt(x, y) {
    var row = Math.floor((y + scroller.scrollTop) / LANE_H);
    var entry = visible[row];
    if (!entry || entry.header) return -1;
    var t = tOf(x);
    var slack = 5 / scale();
    var best = -1;
    var bestSpan = Infinity;
    itemsInView(entry.lane, t - slack, t + slack, function (index) {
      var span = it.end[index] - it.start[index];
      var instant = span * scale() < 3;
      var hit = instant ? Math.abs(it.start[index] - t) <= slack : it.start[index] <= t && t <= it.end[index];
      var weight = instant ? -1 : span;
      if (hit && weight < bestSpan) { best = index; bestSpan = weight; }
    });
    return best;
  }

  function describe(index) {
    var kind = kinds[it.kind[index]];
    var from = seconds(it.start[index]);
    var when = it.end[index] > it.start[index] ? from + ' s \u2013 ' + seconds(it.end[index]) + ' s' : from + ' s';
    var what = kind + (it.label[index] ? ': ' + it.label[index] : '') + (it.state[index] ? ' \u2192 ' + it.state[index] : '');
    var traced = [lines[it.line[index]]];
    if (it.endLine[index] !== null && it.endLine[index] !== it.line[index]) traced.push(lines[it.endLine[index]]);
    return { what: what, when: when, lines: traced.join('\n') };
  }

  plot.addEventListener('mousemove', function (event) {
    if (drag) return;
    var rect = plot.getBoundingClientRect();
    var index = itemAt(event.clientX - rect.left, event.clientY - rect.top);
    if (index !== state.hover) {
      state.hover = index;
      draw();
    }
    if (index < 0) {
      tooltip.hidden = true;
      return;
    }
    var described = describe(index);
    tooltip.textContent = '';
    var what = document.createElement('div');
    what.className = 'what';
    what.textContent = described.what;
    var when = document.createElement('div');
    when.textContent = described.when;
    var pre = document.createElement('pre');
    pre.textContent = described.lines;
    tooltip.appendChild(what);
    tooltip.appendChild(when);
    tooltip.appendChild(pre);
    tooltip.hidden = false;
    var x = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
    var y = event.clientY + 16 + tooltip.offsetHeight > window.innerHeight ? event.clientY - tooltip.offsetHeight - 8 : event.clientY + 16;
    tooltip.style.left = Math.max(4, x) + 'px';
    tooltip.style.top = Math.max(4, y) + 'px';
  });
  plot.addEventListener('mouseleave', function () {
    tooltip.hidden = true;
    if (state.hover >= 0) { state.hover = -1; draw(); }
  });

  // ---- zoom and pan ----
  var drag = null;
  plot.addEventListener('mousedown', function (event) {
    drag = { x: event.clientX, y: event.clientY, t0: state.t0, t1: state.t1, top: scroller.scrollTop };
    plot.classList.add('dragging');
    tooltip.hidden = true;
  });
  window.addEventListener('mousemove', function (event) {
    if (!drag) return;
    var dt = (event.clientX - drag.x) / scale();
    zoomTo(drag.t0 - dt, drag.t1 - dt);
    scroller.scrollTop = drag.top - (event.clientY - drag.y);
  });
  window.addEventListener('mouseup', function () {
    drag = null;
    plot.classList.remove('dragging');
  });
  scroller.addEventListener('wheel', function (event) {
    var rect = plot.getBoundingClientRect();
    var t = tOf(event.clientX - rect.left);
    if (event.ctrlKey || event.metaKey) {
      event.preventDefault();
      zoomAround(t, Math.pow(1.0015, event.deltaY));
    } else if (Math.abs(event.deltaX) > Math.abs(event.deltaY) || event.shiftKey) {
      event.preventDefault();
      var dx = event.deltaX || event.deltaY;
      var dt = dx / scale();
      zoomTo(state.t0 + dt, state.t1 + dt);
    }
  }, { passive: false });
  plot.addEventListener('dblclick', function (event) {
    var rect = plot.getBoundingClientRect();
    zoomAround(tOf(event.clientX - rect.left), event.shiftKey ? 2 : 0.5);
  });
  scroller.addEventListener('scroll', draw);
  document.getElementById('zoom-in').addEventListener('click', function () { zoomAround((state.t0 + state.t1) / 2, 0.5); });
  document.getElementById('zoom-out').addEventListener('click', function () { zoomAround((state.t0 + state.t1) / 2, 2); });
  document.getElementById('zoom-fit').addEventListener('click', function () { zoomTo(0, end); });
  window.addEventListener('keydown', function (event) {
    if (event.target === rowInput) return;
    var mid = (state.t0 + state.t1) / 2;
    var span = state.t1 - state.t0;
    if (event.key === '+' || event.key === '=') zoomAround(mid, 0.5);
    else if (event.key === '-') zoomAround(mid, 2);
    else if (event.key === '0') zoomTo(0, end);
    else if (event.key === 'ArrowLeft') zoomTo(state.t0 - span / 5, state.t1 - span / 5);
    else if (event.key === 'ArrowRight') zoomTo(state.t0 + span / 5, state.t1 + span / 5);
    else if (event.key === 'Escape') clearFilter();
  });
  window.addEventListener('resize', resize);

  // ---- start ----
  if (data.focus && data.focus.op !== null) state.op = data.focus.op;
  if (data.focus && data.focus.rows.length) state.rows = new Set(data.focus.rows);
  resize();
  relayout();

  // What tests and users' scripts may ask the page (the lanes shown, the view), and drive it with.
  window.lockstepTimeline = {
    lanesShown: function () {
      return visible.filter(function (v) { return !v.header; }).map(function (v) {
        return { group: lanes[v.lane].group, key: lanes[v.lane].key };
      });
    },
    view: function () { return { t0: state.t0, t1: state.t1 }; },
    setOperation: setOperation,
    setRows: setRows,
    clearFilter: clearFilter,
    focusViolation: focusViolation,
    // The page coordinates (CSS pixels, viewport) of the middle of the first item of `kind` in view, or null.
    locate: function (kind) {
      var rect = plot.getBoundingClientRect();
      var top = scroller.scrollTop;
      for (var row = 0; row < visible.length; row++) {
        var y = row * LANE_H - top;
        if (visible[row].header || y < 0 || y + LANE_H > plot.clientHeight) continue;
        var found = null;
        itemsInView(visible[row].lane, state.t0, state.t1, function (index) {
          if (found === null && kinds[it.kind[index]] === kind) {
            var x0 = Math.max(0, xOf(it.start[index]));
            var x1 = Math.min(plot.clientWidth, xOf(it.end[index]));
            found = { x: rect.left + (x0 + x1) / 2, y: rect.top + y + LANE_H / 2 };
          }
        });
        if (found) return found;
      }
      return null;
    },
    // The moment of the `index`-th violation (simulated microseconds), or null.
    moment: function (index) {
      var failed = (data.checkers || []).filter(function (checker) { return !checker.ok; });
      return failed[index] ? failed[index].at : null;
    },
    // The first operation the first violation names, or null.
    failingOperation: function () {
      var failed = (data.checkers || []).filter(function (checker) { return !checker.ok && checker.ops.length; });
      return failed.length ? failed[0].ops[0] : null;
    },
    ready: true
  };
  // Milliseconds from the navigation's start to a drawn page (the 10 000-row world's is measured with it).
  document.body.dataset.readyMs = String(Math.round(performance.now()));
  document.body.dataset.ready = 'true';
})();
