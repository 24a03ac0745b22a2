// Keyboard shortcuts: j/k move the focus through a list's rows, the queue's or the
// approvals' ([data-queue]; Enter opens, as on any link),
// / searches the queue (from any page: it goes to the queue first), ? shows the sheet.
(function () {
  "use strict";
  // The row last moved to: j/k go on from it, even after focus went elsewhere.
  var selected = -1;

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-queue] tbody tr"));
  }

  // j/k move the keyboard focus to a row's link, so that Enter opens it and a screen
  // reader follows; the row's highlight is CSS :focus-within, so it always shows focus.
  function move(step) {
    var all = rows();
    if (!all.length) return;
    var focused = all.findIndex(function (row) { return row.contains(document.activeElement); });
    var from = focused >= 0 ? focused : selected;
    selected = Math.max(0, Math.min(from + step, all.length - 1));
    var link = all[selected].querySelector("a");
    if (!link) return;
    link.focus({ preventScroll: true });
    all[selected].scrollIntoView({ block: "nearest" });
  }

  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    var dialog = document.getElementById("shortcuts");
    if (dialog && dialog.open) return;
    if (event.key === "j") move(1);
    else if (event.key === "k") move(-1);
    else if (event.key === "/") {
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
    if (row && !event.target.closest("a, input, label, .pick")) window.location.href = row.dataset.href;
  });

  // The queue's header checkbox picks, or unpicks, every operation on the page.
  document.addEventListener("change", function (event) {
    if (!event.target.matches || !event.target.matches("[data-pick-all]")) return;
    document.querySelectorAll("[data-queue] tbody .pick input").forEach(function (box) {
      box.checked = event.target.checked;
    });
  });

  // Arrived by / from another page: the search is what was asked for.
  document.addEventListener("DOMContentLoaded", function () {
    var search = document.getElementById("id_q");
    if (search && window.location.hash === "#search") search.focus();
  });

  // New results (a filter, the next page): nothing is selected in them yet. A list that
  // redraws itself (the approvals poll) keeps the row in focus, found by where it leads,
  // so that a poll never takes it from under the keyboard.
  var focusedHref = null;
  document.addEventListener("htmx:beforeSwap", function () {
    var row = document.activeElement && document.activeElement.closest &&
      document.activeElement.closest("[data-queue] tbody tr");
    focusedHref = row ? row.dataset.href : null;
  });
  document.addEventListener("htmx:afterSwap", function () {
    selected = -1;
    if (!focusedHref || document.activeElement !== document.body) return;
    var all = rows();
    var again = all.findIndex(function (row) { return row.dataset.href === focusedHref; });
    focusedHref = null;
    if (again < 0) return;
    selected = again;
    var link = all[again].querySelector("a");
    if (link) link.focus({ preventScroll: true });
  });

  // A redraw keeps the inputs marked hx-preserve, text and all; but where the browser has
  // no Element.moveBefore, htmx moves them with replaceChild, which drops the focus. Put
  // the operator back where they were typing.
  var typingIn = null;
  document.addEventListener("htmx:beforeSwap", function () {
    var active = document.activeElement;
    typingIn = active && active.hasAttribute("hx-preserve") && active.id
      ? { element: active, start: active.selectionStart, end: active.selectionEnd }
      : null;
  });
  document.addEventListener("htmx:afterSwap", function () {
    var kept = typingIn;
    typingIn = null;
    if (!kept || kept.element === document.activeElement || !kept.element.isConnected) return;
    kept.element.focus({ preventScroll: true });
    if (kept.start !== null) kept.element.setSelectionRange(kept.start, kept.end);
  });
})();
