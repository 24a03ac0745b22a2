// The browser's half of a passkey ceremony in WebAuthn's JSON form (base64url), for
// the console's signed decisions (settle/sign.js) and a customer's pages
// (customers/passkey.js): window.settleWebAuthn.signed(options) asks the passkey to sign
// (navigator.credentials.get) and .created(options) registers one
// (navigator.credentials.create). Settle checks every answer itself.
"use strict";

(() => {
  const bytes = (text) =>
    Uint8Array.from(
      atob(text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4)),
      (c) => c.charCodeAt(0),
    );
  const text = (buffer) =>
    btoa(String.fromCharCode(...new Uint8Array(buffer)))
      .replace(/\+/g, "-")
      .replace(/\//g, "_")
      .replace(/=+$/, "");

  // Credential descriptors (allowed or excluded passkeys), their ids as bytes.
  const descriptors = (list) => (list || []).map((c) => ({ ...c, id: bytes(c.id) }));
  // A ceremony's credential as JSON: what both answers share, and ``response``'s own fields.
  const answer = (credential, response) => ({
    id: credential.id,
    rawId: text(credential.rawId),
    type: credential.type,
    authenticatorAttachment: credential.authenticatorAttachment,
    response: { clientDataJSON: text(credential.response.clientDataJSON), ...response },
    clientExtensionResults: credential.getClientExtensionResults(),
  });

  async function signed(options) {
    const publicKey = {
      ...options.publicKey,
      challenge: bytes(options.publicKey.challenge),
      allowCredentials: descriptors(options.publicKey.allowCredentials),
    };
    const credential = await navigator.credentials.get({ publicKey });
    const { response } = credential;
    return answer(credential, {
      authenticatorData: text(response.authenticatorData),
      signature: text(response.signature),
      userHandle: response.userHandle ? text(response.userHandle) : null,
    });
  }

  async function created(options) {
    const publicKey = {
      ...options.publicKey,
      challenge: bytes(options.publicKey.challenge),
      user: { ...options.publicKey.user, id: bytes(options.publicKey.user.id) },
      excludeCredentials: descriptors(options.publicKey.excludeCredentials),
    };
    const credential = await navigator.credentials.create({ publicKey });
    const { response } = credential;
    return answer(credential, {
      attestationObject: text(response.attestationObject),
      transports: response.getTransports ? response.getTransports() : [],
    });
  }

  window.settleWebAuthn = { signed, created };
})();
