// The page of `tessera view`: the job's index, and one slide at a time as a deep-zoom image with its heatmap layer,
// quality control's layer (when infer wrote <slide>.qc.png), region outlines and ground truth. Talks to the server of viewer/server.h only. `window.tessera` exposes the
// viewer and what has loaded (`state`), so that a test can wait for events instead of sleeping.
'use strict';

const tessera = {
  viewer: null,
  slide: null,      // the slide's JSON (/api/slides/<id>)
  grid: null,       // the heatmap's probabilities (/api/slides/<id>/heatmap)
  slideItem: null,
  heatmapItem: null,
  qcItem: null,     // quality control's layer: excluded areas grey, flagged ones amber
  selected: null,   // the region last clicked
  state: { index: false, slideLoaded: false, heatmapLoaded: false, qcLoaded: false, animating: false, zooms: 0,
           error: null },
};
window.tessera = tessera;

const COLORMAPS = {  // matplotlib's maps at 0, 0.25, 0.5, 0.75, 1, for the legend
  inferno: ['#000004', '#57106e', '#bc3754', '#f98e09', '#fcffa4'],
  viridis: ['#440154', '#3b528b', '#21918c', '#5ec962', '#fde725'],
};

const $ = (id) => document.getElementById(id);

function text(tag, content, cls) {
  const el = document.createElement(tag);
  el.textContent = content;
  if (cls) el.className = cls;
  return el;
}

async function getJson(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url}: ${res.status} ${await res.text()}`);
  return res.json();
}

function fmtProb(p) { return p === null || p === undefined ? '—' : Number(p).toFixed(3); }

// ---- the index -------------------------------------------------------------------------------------------------

async function showIndex() {
  $('slide-page').hidden = true;
  $('index-page').hidden = false;
  destroyViewer();
  const job = await getJson('/api/job');
  $('title').textContent = job.title;
  const body = document.querySelector('#index tbody');
  body.replaceChildren();
  for (const s of job.slides) {
    const row = document.createElement('tr');
    row.dataset.id = s.id;
    const thumb = document.createElement('td');
    if (!s.error) {
      const img = document.createElement('img');
      img.src = `/api/slides/${encodeURIComponent(s.id)}/thumbnail.jpg`;
      img.alt = s.id;
      thumb.append(img);
    }
    row.append(thumb, text('td', s.id));
    if (s.error) {
      row.className = 'failed';
      const cell = text('td', s.error);
      cell.colSpan = 5;
      row.append(cell);
    } else {
      row.className = 'slide';
      const c = s.regions_per_size_class;
      row.append(text('td', fmtProb(s.score)), text('td', c.isolated_tumour_cells), text('td', c.micrometastasis),
                 text('td', c.macrometastasis),
                 text('td', (s.has_heatmap ? 'heatmap' : 'slide') + (s.has_ground_truth ? ', ground truth' : '')));
      row.addEventListener('click', () => { location.hash = `#slide=${encodeURIComponent(s.id)}`; });
    }
    body.append(row);
  }
  const failed = job.slides.filter((s) => s.error).length;
  $('index-status').textContent = `${job.slides.length} slides` + (failed ? `, ${failed} cannot be shown` : '');
  tessera.state.index = true;
}

// ---- one slide -------------------------------------------------------------------------------------------------

function destroyViewer() {
  if (tessera.viewer) tessera.viewer.destroy();
  Object.assign(tessera,
                { viewer: null, slide: null, grid: null, slideItem: null, heatmapItem: null, qcItem: null, selected: null });
  Object.assign(tessera.state, { slideLoaded: false, heatmapLoaded: false, qcLoaded: false, animating: false, zooms: 0 });
}

function heatmapUrl(id) {
  return `/dzi/${encodeURIComponent(id)}/heatmap-${$('threshold').value}.dzi`;
}

function heatmapOpacity() {
  return $('heatmap-toggle').checked ? Number($('opacity').value) / 100 : 0;
}

// (Re)loads the heatmap layer for the current threshold; the old layer goes when the new one is in.
function addHeatmap() {
  const s = tessera.slide;
  tessera.state.heatmapLoaded = false;
  tessera.viewer.addTiledImage({
    tileSource: heatmapUrl(s.id),
    opacity: heatmapOpacity(),
    success: (event) => {
      const old = tessera.heatmapItem;
      tessera.heatmapItem = event.item;
      if (old) tessera.viewer.world.removeItem(old);
      watchLoaded(event.item, 'heatmapLoaded');
    },
  });
}

// Quality control's layer, above the heatmap; the checkbox shows or hides it.
function addQc() {
  tessera.viewer.addTiledImage({
    tileSource: `/dzi/${encodeURIComponent(tessera.slide.id)}/qc.dzi`,
    opacity: $('qc-toggle').checked ? 1 : 0,
    success: (event) => {
      tessera.qcItem = event.item;
      watchLoaded(event.item, 'qcLoaded');
    },
  });
}

function watchLoaded(item, flag) {
  const update = () => { tessera.state[flag] = item.getFullyLoaded(); };
  item.addHandler('fully-loaded-change', update);
  update();
}

async function showSlide(id) {
  $('index-page').hidden = true;
  $('slide-page').hidden = false;
  destroyViewer();
  if (!$('title').textContent) $('title').textContent = (await getJson('/api/job')).title;  // opened at #slide=
  const s = await getJson(`/api/slides/${encodeURIComponent(id)}`);
  tessera.slide = s;
  $('slide-name').textContent = s.id;
  $('slide-score').textContent = s.error ? s.error : `slide score ${fmtProb(s.score)}`;
  if (s.error) return;
  $('heatmap-controls').hidden = !s.heatmap;
  $('qc-controls').hidden = !s.has_qc;
  $('threshold').value = 0;
  $('threshold-value').textContent = '0.00';
  if (s.heatmap) {
    const stops = COLORMAPS[s.heatmap.colormap] || COLORMAPS.inferno;
    $('legend').style.background = `linear-gradient(to right, ${stops.join(', ')})`;
    $('legend').title = `${s.heatmap.colormap}: P 0 → 1`;
    tessera.grid = await getJson(`/api/slides/${encodeURIComponent(id)}/heatmap`);
  }
  $('truth-label').hidden = !s.ground_truth || s.ground_truth.length === 0;
  $('truth-toggle').checked = false;
  $('truth-error').textContent = s.ground_truth_error ? `ground truth: ${s.ground_truth_error}` : '';
  showRegions(s);
  showProvenance(s);

  const viewer = OpenSeadragon({
    element: $('viewer'),
    prefixUrl: '/static/images/',
    tileSources: `/dzi/${encodeURIComponent(id)}/slide.dzi`,
    showNavigator: true,
    maxZoomPixelRatio: 2,
    crossOriginPolicy: false,
    // The 2D canvas drawer: it composites the heatmap's transparent PNG tiles over the slide as the browser does
    // any image (source-over); OpenSeadragon 5's default WebGL drawer brightens them.
    drawer: 'canvas',
  });
  tessera.viewer = viewer;
  viewer.addHandler('open', () => {
    tessera.slideItem = viewer.world.getItemAt(0);
    watchLoaded(tessera.slideItem, 'slideLoaded');
    if (s.heatmap) addHeatmap();
    if (s.has_qc) addQc();
    draw();
  });
  viewer.addHandler('open-failed', (e) => { tessera.state.error = e.message; });
  viewer.addHandler('update-viewport', draw);
  viewer.addHandler('animation-start', () => { tessera.state.animating = true; });
  viewer.addHandler('animation-finish', () => { tessera.state.animating = false; tessera.state.zooms += 1; });
  new OpenSeadragon.MouseTracker({
    element: viewer.container,
    moveHandler: (e) => showCursor(e.position),
  });
}

function showRegions(s) {
  const list = $('regions');
  list.replaceChildren();
  if (s.regions.length === 0) list.append(text('li', s.heatmap ? 'none above the threshold' : '—'));
  for (const r of s.regions) {
    const item = text('li', `Region ${r.id}: ${r.size_class.replaceAll('_', ' ')}: ${r.area_mm2.toFixed(4)} mm², ` +
                             `${r.longest_diameter_um.toFixed(0)} µm, max P ${fmtProb(r.max_prob)}`);
    item.dataset.id = r.id;
    item.addEventListener('click', () => zoomToRegion(r));
    list.append(item);
  }
}

function zoomToRegion(r) {
  const [x, y, w, h] = r.bounds;
  tessera.selected = r.id;
  const margin = 0.1 * Math.max(w, h);
  const rect = tessera.slideItem.imageToViewportRectangle(x - margin, y - margin, w + 2 * margin, h + 2 * margin);
  tessera.viewer.viewport.fitBounds(rect);
  draw();
}

function showProvenance(s) {
  const p = $('provenance');
  p.className = s.caution ? 'caution' : '';
  const parts = [];
  const m = s.model;
  if (m) {
    let line = `Model ${m.checkpoint || ''}`;
    if (m.training_data) {
      line += `: trained on ${m.training_data} data`;
      const n = m.training_slides;
      if (n) line += ` (${n.real} real, ${n.synthetic} synthetic, ${n.unknown} unknown slides)`;
    }
    if (m.tile_mpp) line += `; tiles of ${m.tile_um} µm at ${m.tile_mpp} µm/px`;
    parts.push(line);
  }
  if (s.caution) parts.push(s.caution);
  parts.push(`${s.width} × ${s.height} px` + (s.mpp ? `, ${s.mpp.toFixed(4)} µm/px` : ', resolution unknown') +
             (s.vendor ? `, ${s.vendor}` : ''));
  p.textContent = parts.join(' — ');
}

// ---- drawing over the slide ------------------------------------------------------------------------------------

function niceLength(um) {  // the largest 1, 2, 5 × 10^k not above um
  const k = Math.pow(10, Math.floor(Math.log10(um)));
  for (const f of [5, 2, 1]) if (f * k <= um) return f * k;
  return k;
}

function drawScaleBar() {
  const s = tessera.slide;
  if (!s.mpp || !tessera.slideItem) { $('scalebar').hidden = true; return; }
  $('scalebar').hidden = false;
  const zoom = tessera.slideItem.viewportToImageZoom(tessera.viewer.viewport.getZoom(true));
  const umPerScreenPx = s.mpp / zoom;
  const length = niceLength(150 * umPerScreenPx);
  $('scalebar-bar').style.width = `${length / umPerScreenPx}px`;
  $('scalebar-text').textContent = length >= 1000 ? `${length / 1000} mm` : `${length} µm`;
}

function tracePath(ctx, ring) {
  ring.forEach(([x, y], i) => {
    const p = tessera.slideItem.imageToViewerElementCoordinates(new OpenSeadragon.Point(x, y));
    if (i === 0) ctx.moveTo(p.x, p.y); else ctx.lineTo(p.x, p.y);
  });
  ctx.closePath();
}

function draw() {
  if (!tessera.viewer || !tessera.slideItem) return;
  const canvas = $('outlines');
  const box = $('viewer');
  canvas.width = box.clientWidth;
  canvas.height = box.clientHeight;
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const s = tessera.slide;
  if ($('regions-toggle').checked) {
    for (const r of s.regions) {
      if (!r.outline) continue;
      ctx.beginPath();
      tracePath(ctx, r.outline.outer);
      for (const hole of r.outline.holes) tracePath(ctx, hole);
      ctx.lineWidth = r.id === tessera.selected ? 3 : 2;
      ctx.strokeStyle = r.id === tessera.selected ? '#ff00ff' : '#00e5ff';
      ctx.stroke();
    }
  }
  if ($('truth-toggle').checked && s.ground_truth) {
    ctx.setLineDash([6, 4]);
    for (const a of s.ground_truth) {
      ctx.beginPath();
      tracePath(ctx, a.outer);
      for (const hole of a.holes) tracePath(ctx, hole);
      ctx.lineWidth = 2;
      ctx.strokeStyle = a.exclusion ? '#ffa000' : '#00c853';
      ctx.stroke();
    }
    ctx.setLineDash([]);
  }
  drawScaleBar();
}

// The probability of the heatmap cell whose footprint holds level-0 (x, y) (the heatmap TIFF's rule), or null.
function probabilityAt(x, y) {
  const h = tessera.slide && tessera.slide.heatmap;
  if (!h || !tessera.grid) return null;
  const startX = h.origin_x + 0.5 * (h.tile - h.step);
  const startY = h.origin_y + 0.5 * (h.tile - h.step);
  const col = Math.floor((x - startX) / h.step);
  const row = Math.floor((y - startY) / h.step);
  if (col < 0 || row < 0 || col >= h.cols || row >= h.rows) return null;
  return tessera.grid.prob[row * h.cols + col];
}
tessera.probabilityAt = probabilityAt;

function showCursor(position) {
  if (!tessera.slideItem) return;
  const p = tessera.slideItem.viewerElementToImageCoordinates(position);
  const s = tessera.slide;
  const where = s.mpp ? `x ${(p.x * s.mpp).toFixed(1)} µm, y ${(p.y * s.mpp).toFixed(1)} µm`
                      : `x ${Math.round(p.x)} px, y ${Math.round(p.y)} px`;
  const prob = s.heatmap ? `P ${fmtProb(probabilityAt(p.x, p.y))}, ` : '';
  $('cursor').textContent = prob + where;
}

// ---- controls and routing --------------------------------------------------------------------------------------

$('opacity').addEventListener('input', () => {
  $('opacity-value').textContent = (Number($('opacity').value) / 100).toFixed(2);
  if (tessera.heatmapItem) tessera.heatmapItem.setOpacity(heatmapOpacity());
});
$('heatmap-toggle').addEventListener('change', () => {
  if (tessera.heatmapItem) tessera.heatmapItem.setOpacity(heatmapOpacity());
});
$('qc-toggle').addEventListener('change', () => {
  if (tessera.qcItem) tessera.qcItem.setOpacity($('qc-toggle').checked ? 1 : 0);
});
$('threshold').addEventListener('change', () => {
  $('threshold-value').textContent = (Number($('threshold').value) / 100).toFixed(2);
  if (tessera.viewer && tessera.slide.heatmap) addHeatmap();
});
$('regions-toggle').addEventListener('change', draw);
$('truth-toggle').addEventListener('change', draw);
window.addEventListener('resize', draw);

function route() {
  const m = location.hash.match(/^#slide=(.+)$/);
  const shown = m ? showSlide(decodeURIComponent(m[1])) : showIndex();
  shown.catch((e) => { tessera.state.error = String(e); $('index-status').textContent = String(e); });
}
window.addEventListener('hashchange', route);
route();
