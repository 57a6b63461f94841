/* unity plan report: zoom/pan for the SVG views, expanding collapsed groups.
   Inlined into the page by unity_cli/report/html.py; no dependencies. */
(function () {
  "use strict";

  function Zoom(svg) {
    var vb = svg.getAttribute("viewBox").split(" ").map(Number);
    this.svg = svg; this.W = vb[2]; this.H = vb[3];
    this.maxH = Number(svg.getAttribute("data-max-height") || 620);
    this.init();
    var self = this, drag = null;
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = svg.getBoundingClientRect();
      self.zoomAt(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
    }, { passive: false });
    svg.addEventListener("mousedown", function (ev) {
      drag = { x: ev.clientX, y: ev.clientY, moved: 0 }; svg.classList.add("dragging");
    });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      drag.moved += Math.abs(dx) + Math.abs(dy); drag.x = ev.clientX; drag.y = ev.clientY;
      self.x -= dx / self.s; self.y -= dy / self.s; self.apply();
    });
    window.addEventListener("mouseup", function () {
      if (drag) { svg.dataset.dragged = drag.moved > 4 ? "1" : ""; }
      drag = null; svg.classList.remove("dragging");
    });
  }
  Zoom.prototype.init = function () {
    var cw = this.svg.parentNode.clientWidth || 1000;
    var s = Math.min(1, cw / this.W);
    if (s < 0.6) s = 0.6;            /* wider than the page: start readable, pan to see the rest */
    this.cw = cw; this.ch = Math.max(60, Math.min(this.maxH, this.H * s + 2));
    this.svg.style.height = this.ch + "px";
    this.s = s; this.x = 0; this.y = 0; this.apply();
  };
  Zoom.prototype.fit = function () {
    this.s = Math.min(this.cw / this.W, this.ch / this.H); this.x = 0; this.y = 0; this.apply();
  };
  Zoom.prototype.zoomAt = function (f, mx, my) {
    var s2 = Math.max(0.02, Math.min(8, this.s * f));
    var px = this.x + mx / this.s, py = this.y + my / this.s;
    this.s = s2; this.x = px - mx / s2; this.y = py - my / s2; this.apply();
  };
  Zoom.prototype.apply = function () {
    var vb = [this.x, this.y, this.cw / this.s, this.ch / this.s].map(function (v) { return v.toFixed(2); });
    this.svg.setAttribute("viewBox", vb.join(" "));
  };

  var zooms = {};
  function zoomOf(id) {
    if (!zooms[id]) { var el = document.getElementById(id); if (el) zooms[id] = new Zoom(el); }
    return zooms[id];
  }

  document.querySelectorAll("[data-zoom]").forEach(function (btn) {
    btn.addEventListener("click", function () {
      var z = zoomOf(btn.getAttribute("data-target")); if (!z) return;
      var what = btn.getAttribute("data-zoom");
      if (what === "reset") z.init(); else if (what === "fit") z.fit();
      else z.zoomAt(what === "in" ? 1.25 : 0.8, z.cw / 2, z.ch / 2);
    });
  });

  function show(viewId) {
    document.querySelectorAll(".diagram-view").forEach(function (v) { v.hidden = v.id !== viewId; });
    var svg = document.querySelector("#" + viewId + " svg");
    if (svg) zoomOf(svg.id);
  }
  document.querySelectorAll(".group").forEach(function (g) {
    function open() {
      var svg = g.ownerSVGElement;
      if (svg && svg.dataset.dragged) { svg.dataset.dragged = ""; return; }
      show("view-group-" + g.getAttribute("data-group"));
    }
    g.addEventListener("click", open);
    g.addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(); } });
  });
  document.querySelectorAll("[data-show]").forEach(function (btn) {
    btn.addEventListener("click", function () { show(btn.getAttribute("data-show")); });
  });

  var linked = /^#(view-group-\d+)$/.exec(window.location.hash);   /* report.html#view-group-2 opens a group */
  if (linked && document.getElementById(linked[1])) show(linked[1]);
  document.querySelectorAll("svg.zoomable").forEach(function (svg) {
    if (svg.closest("[hidden]") === null) zoomOf(svg.id);
  });
  document.documentElement.setAttribute("data-ready", "1");
})();
