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

  async function signed(options) {
    const publicKey = {
      ...options.publicKey,
      challenge: bytes(options.publicKey.challenge),
      allowCredentials: (options.publicKey.allowCredentials || []).map((c) => ({
        ...c,
        id: bytes(c.id),
      })),
    };
    const credential = await navigator.credentials.get({ publicKey });
    return {
      id: credential.id,
      rawId: text(credential.rawId),
      type: credential.type,
      authenticatorAttachment: credential.authenticatorAttachment,
      response: {
        clientDataJSON: text(credential.response.clientDataJSON),
        authenticatorData: text(credential.response.authenticatorData),
        signature: text(credential.response.signature),
        userHandle: credential.response.userHandle ? text(credential.response.userHandle) : null,
      },
      clientExtensionResults: credential.getClientExtensionResults(),
    };
  }

  async function created(options) {
    const publicKey = {
      ...options.publicKey,
      challenge: bytes(options.publicKey.challenge),
      user: { ...options.publicKey.user, id: bytes(options.publicKey.user.id) },
      excludeCredentials: (options.publicKey.excludeCredentials || []).map((c) => ({
        ...c,
        id: bytes(c.id),
      })),
    };
    const credential = await navigator.credentials.create({ publicKey });
    return {
      id: credential.id,
      rawId: text(credential.rawId),
      type: credential.type,
      authenticatorAttachment: credential.authenticatorAttachment,
      response: {
        clientDataJSON: text(credential.response.clientDataJSON),
        attestationObject: text(credential.response.attestationObject),
        transports: credential.response.getTransports ? credential.response.getTransports() : [],
      },
      clientExtensionResults: credential.getClientExtensionResults(),
    };
  }

  window.settleWebAuthn = { signed, created };
})();
