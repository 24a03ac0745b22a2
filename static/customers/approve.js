// The approval link's page. The token is in the URL's fragment, which no request
// carries: this script sends it in POST bodies alone, with the page's CSRF token, and
// swaps in the HTML the server answers (the approval, or why it was refused).
(function () {
  "use strict";
  var main = document.querySelector("main.customer");
  if (!main) return;
  var token = decodeURIComponent(window.location.hash.replace(/^#/, ""));
  var csrf = main.querySelector("[data-csrf]").value;
  var approval = main.querySelector("[data-approval]");
  var refusal = main.querySelector("[data-refusal]");

  function fragment(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    return Array.prototype.slice.call(doc.body.childNodes);
  }

  function post(url, fields) {
    var body = new URLSearchParams(fields);
    body.set("token", token);
    return fetch(url, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      referrerPolicy: "no-referrer",
      cache: "no-store",
      headers: { "X-CSRFToken": csrf },
    }).then(function (response) {
      return response.text().then(function (html) {
        return { ok: response.ok, html: html };
      });
    });
  }

  function show(answer) {
    if (answer.ok) {
      refusal.replaceChildren();
      approval.replaceChildren.apply(approval, fragment(answer.html));
    } else {
      refusal.replaceChildren.apply(refusal, fragment(answer.html));
    }
    return answer;
  }

  function load() {
    return post(main.dataset.stateUrl, {}).then(function (answer) {
      if (!answer.ok) approval.replaceChildren();
      return show(answer);
    });
  }

  function failed() {
    refusal.textContent = main.dataset.offline || "The connection failed. Try again.";
    Array.prototype.forEach.call(approval.querySelectorAll("button"), function (b) {
      b.disabled = false;
    });
  }

  function enable() {
    Array.prototype.forEach.call(approval.querySelectorAll("button"), function (b) {
      b.disabled = false;
    });
  }

  // The fields with the passkey's signed answer, or null (refused or not unlocked: the
  // page says which, and nothing was decided).
  function signed(fields) {
    var body = new URLSearchParams({ decision: fields.decision, token: token });
    return fetch(main.dataset.signUrl, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      referrerPolicy: "no-referrer",
      cache: "no-store",
      headers: { "X-CSRFToken": csrf },
    }).then(function (response) {
      if (!response.ok) {
        return response.text().then(function (html) {
          show({ ok: false, html: html });
          enable();
          return null;
        });
      }
      return response.json().then(function (options) {
        return window.settleCustomerSign(options).then(
          function (credential) {
            fields.credential = JSON.stringify(credential);
            fields.statement = options.statement;
            return fields;
          },
          function () {
            var box = document.createElement("div");
            box.className = "customer-refused";
            box.setAttribute("role", "alert");
            box.dataset.code = "not_signed";
            box.appendChild(document.createElement("p")).textContent = main.dataset.unsigned;
            refusal.replaceChildren(box);
            enable();
            return null;
          },
        );
      });
    });
  }

  approval.addEventListener("submit", function (event) {
    var form = event.target.closest("[data-decide]");
    if (!form) return;
    event.preventDefault();
    var button = event.submitter;
    if (!button || !button.dataset.decision) return;
    var fields = {
      decision: button.dataset.decision,
      reason: form.elements.reason.value,
      params_digest: form.elements.params_digest.value,
    };
    Array.prototype.forEach.call(form.querySelectorAll("button"), function (b) {
      b.disabled = true;
    });
    // A decision the party must sign (customer_passkey): Settle makes the statement and
    // the options; the phone's passkey signs it; the decision carries both.
    var sent = form.hasAttribute("data-sign") ? signed(fields) : Promise.resolve(fields);
    sent
      .then(function (ready) {
        if (!ready) return null;
        return post(main.dataset.decideUrl, ready).then(show);
      })
      .then(function (answer) {
        // Refused (decided in another tab, expired meanwhile): show how it stands now.
        if (answer && !answer.ok) return post(main.dataset.stateUrl, {}).then(function (now) {
          if (now.ok) approval.replaceChildren.apply(approval, fragment(now.html));
        });
      })
      .catch(failed);
  });

  load().catch(failed);
})();
