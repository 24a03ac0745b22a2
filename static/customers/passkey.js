// A customer's passkey, on their phone: enrolment from the host's one-time link, and
// the browser's half of signing a decision (window.settleCustomerSign).
//
// The enrolment link's token is in the URL's fragment, which the browser never sends:
// read here, taken out of the address bar, and sent in POST bodies only. Settle keeps
// the ceremony's state signed and checks every answer itself: the page decides nothing.
"use strict";

(() => {
  const { signed, created } = window.settleWebAuthn;
  const csrf = () => document.querySelector("[name=csrfmiddlewaretoken]").value;

  async function post(url, body) {
    const answer = await fetch(url, {
      method: "POST",
      body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
      credentials: "same-origin",
      referrerPolicy: "no-referrer",
    });
    return { ok: answer.ok, body: await answer.json() };
  }

  // For the approval page: sign the statement whose options Settle gave.
  window.settleCustomerSign = signed;

  function enrol(root) {
    const status = root.querySelector("[data-enrol-status]");
    const form = root.querySelector("[data-enrol-form]");
    // The page's words, in the customer's language (data-msg-* on the page).
    const words = root.dataset;
    const say = (message, kind) => {
      status.textContent = message;
      status.className = `status ${kind || ""}`;
    };
    const token = window.location.hash.slice(1);
    // Out of the address bar (and the history) as soon as it is read.
    if (token) history.replaceState(null, "", window.location.pathname);
    if (!token) {
      say(words.msgNoLink, "error");
      return;
    }
    let options;
    post(root.dataset.optionsUrl, { token }).catch(() => {
      say(words.msgOffline, "error");
      return null;
    }).then((answer) => {
      if (answer === null) return;
      const { ok, body } = answer;
      if (!ok) {
        say(body.message, "error");
        root.dataset.enrolError = body.error;
        return;
      }
      options = body;
      root.querySelector("[data-enrol-name]").textContent = body.display_name;
      root.querySelector("[data-enrol-who]").hidden = false;
      form.hidden = false;
      say("");
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = form.querySelector("button");
      button.disabled = true;
      say(words.msgCreating);
      try {
        let credential;
        try {
          credential = await created(options);
        } catch (error) {
          say(`${words.msgNotCreated} (${error.name})`, "error");
          return;
        }
        const name = form.querySelector("[name=name]").value;
        const { ok, body } = await post(root.dataset.finishUrl, {
          token,
          state: options.state,
          credential,
          name,
        });
        if (!ok) {
          say(body.message, "error");
          root.dataset.enrolError = body.error;
          form.hidden = true;
          return;
        }
        form.hidden = true;
        root.dataset.enrolled = "true";
        say(words.msgAdded, "ok");
      } finally {
        button.disabled = false;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const root = document.querySelector("[data-enrol]");
    if (root) enrol(root);
  });
})();
