// Draws every chart of the page: each <script type="application/json" data-chart="ID"> holds a
// Vega-Lite spec (made by recs.report.charts), drawn as SVG into the element with that id.
(function () {
  "use strict";
  function drawAll() {
    var specs = document.querySelectorAll('script[type="application/json"][data-chart]');
    specs.forEach(function (node) {
      var target = document.getElementById(node.getAttribute("data-chart"));
      if (!target) { return; }
      var spec = JSON.parse(node.textContent);
      vegaEmbed(target, spec, { actions: false, renderer: "svg" })
        .then(function () { target.setAttribute("data-rendered", "true"); })
        .catch(function (error) {
          target.setAttribute("data-rendered", "error");
          target.textContent = "chart could not be drawn: " + error;
        });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
