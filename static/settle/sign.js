// A decision signed with the person's passkey: on an approval's page, a
// reconciliation request and a bulk batch.
//
// A [data-sign] button asks Settle for the statement to sign (the form's
// [data-sign-url], with the decision), has the browser sign it with the person's
// passkey (navigator.credentials.get, user verification required), and submits the
// form with the decision and the signed answer in WebAuthn's JSON form (base64url),
// to the button's [data-sign-action] where it has one (a form that posts each
// decision to a URL of its own).
// Settle checks the answer against the statement it kept, so the browser's word
// decides nothing. Nothing is sent when the person cancels or cannot unlock it.
"use strict";

(() => {
  const { signed } = window.settleWebAuthn;

  async function sign(button) {
    const form = button.closest("form");
    const status = form.querySelector("[data-sign-status]");
    const url = button.closest("[data-sign-url]").dataset.signUrl;
    const decision = button.dataset.sign;
    const token = form.querySelector("[name=csrfmiddlewaretoken]").value;
    // A field the form requires (a reason) is asked for before the passkey, not after.
    if (!form.reportValidity()) return;
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => (b.disabled = true));
    status.textContent = "Unlock your passkey to sign this decision…";
    try {
      const body = new FormData();
      body.append("decision", decision);
      const answer = await fetch(url, {
        method: "POST",
        body,
        headers: { "X-CSRFToken": token },
        credentials: "same-origin",
      });
      const options = await answer.json();
      if (!answer.ok) {
        status.textContent = `Not signed (${options.error}): ${options.message}. Nothing was decided.`;
        return;
      }
      let credential;
      try {
        credential = await signed(options);
      } catch (error) {
        status.textContent = `Not signed: the passkey was not unlocked (${error.name}). Nothing was decided.`;
        return;
      }
      form.querySelector("[name=credential]").value = JSON.stringify(credential);
      const chosen = document.createElement("input");
      chosen.type = "hidden";
      chosen.name = "decision";
      chosen.value = decision;
      form.appendChild(chosen);
      if (button.dataset.signAction) form.action = button.dataset.signAction;
      status.textContent = "Signed. Sending…";
      form.submit();
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  }

  // The browser's half alone, for a page that signs a statement of its own.
  window.settleSigned = signed;

  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-sign]");
    if (button) {
      event.preventDefault();
      sign(button);
    }
  });
})();
