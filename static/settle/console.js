// Keyboard shortcuts: j/k move through the queue, Enter opens, / searches the queue (from
// any page: it goes to the queue first), ? shows the sheet.
(function () {
  "use strict";
  var selected = -1;

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-queue] tbody tr"));
  }

  function select(index) {
    var all = rows();
    if (!all.length) return;
    selected = Math.max(0, Math.min(index, all.length - 1));
    all.forEach(function (row, i) {
      row.classList.toggle("selected", i === selected);
      row.setAttribute("aria-selected", i === selected ? "true" : "false");
    });
    all[selected].scrollIntoView({ block: "nearest" });
  }

  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    var dialog = document.getElementById("shortcuts");
    if (dialog && dialog.open) return;
    if (event.key === "j") select(selected + 1);
    else if (event.key === "k") select(selected - 1);
    else if (event.key === "Enter") {
      // Enter on a focused link or button is that control's own; only otherwise it opens.
      if (event.target !== document.body || selected < 0 || !rows()[selected]) return;
      window.location.href = rows()[selected].dataset.href;
    } else if (event.key === "/") {
      var search = document.getElementById("id_q");
      if (!search) {
        var home = document.querySelector(".brand");
        if (!home) return;
        window.location.href = home.href + "#search";
      } else {
        search.focus();
        search.select();
      }
    } else if (event.key === "?") {
      if (dialog) dialog.showModal();
    } else return;
    event.preventDefault();
  });

  // A click anywhere on a row opens it, as its key's link does.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("[data-queue] tbody tr");
    if (row && !event.target.closest("a")) window.location.href = row.dataset.href;
  });

  // Arrived by / from another page: the search is what was asked for.
  document.addEventListener("DOMContentLoaded", function () {
    var search = document.getElementById("id_q");
    if (search && window.location.hash === "#search") search.focus();
  });

  // New results (a filter, the next page): nothing is selected in them yet.
  document.addEventListener("htmx:afterSwap", function () { selected = -1; });
})();
