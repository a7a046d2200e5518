// Passkeys: the browser's own navigator.credentials API, with base64url on the wire (py_webauthn's JSON).

const b64urlToBytes = (text) => {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(text.length / 4) * 4, "=");
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
};
const bytesToB64url = (buffer) =>
  btoa(String.fromCharCode(...new Uint8Array(buffer))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");

const csrf = (form) => form.querySelector("input[name=csrfmiddlewaretoken]").value;

async function post(url, form, body) {
  const response = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: {"X-CSRFToken": csrf(form), "Content-Type": "application/json"},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({error: `The server answered ${response.status}.`}));
  if (!response.ok) throw new Error(data.error || `The server answered ${response.status}.`);
  return data;
}

export function creationOptions(json) {
  return {
    ...json,
    challenge: b64urlToBytes(json.challenge),
    user: {...json.user, id: b64urlToBytes(json.user.id)},
    excludeCredentials: (json.excludeCredentials || []).map((c) => ({...c, id: b64urlToBytes(c.id)})),
  };
}

export function registrationJSON(credential) {
  return {
    id: credential.id,
    rawId: bytesToB64url(credential.rawId),
    type: credential.type,
    response: {
      clientDataJSON: bytesToB64url(credential.response.clientDataJSON),
      attestationObject: bytesToB64url(credential.response.attestationObject),
      transports: credential.response.getTransports ? credential.response.getTransports() : [],
    },
    clientExtensionResults: credential.getClientExtensionResults(),
  };
}

const form = document.getElementById("enrol");
if (form) {
  const problem = document.getElementById("enrol-problem");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.hidden = true;
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const options = await post(form.dataset.options, form);
      const credential = await navigator.credentials.create({publicKey: creationOptions(options)});
      const done = await post(form.dataset.enroll, form, {name: form.elements.name.value,
                                                          credential: registrationJSON(credential),
                                                          next: form.elements.next?.value || ""});
      window.location.assign(done.redirect);
    } catch (error) {
      problem.textContent = error.name === "NotAllowedError"
        ? "The passkey prompt was cancelled or timed out. Nothing was enrolled."
        : error.message;
      problem.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
}

// Signing a plan: the server derives the challenge from the plan's digest, the decision and the choices.
export function requestOptions(json) {
  return {
    ...json,
    challenge: b64urlToBytes(json.challenge),
    allowCredentials: (json.allowCredentials || []).map((c) => ({...c, id: b64urlToBytes(c.id)})),
  };
}

export function assertionJSON(credential) {
  return {
    id: credential.id,
    rawId: bytesToB64url(credential.rawId),
    type: credential.type,
    response: {
      clientDataJSON: bytesToB64url(credential.response.clientDataJSON),
      authenticatorData: bytesToB64url(credential.response.authenticatorData),
      signature: bytesToB64url(credential.response.signature),
      userHandle: credential.response.userHandle ? bytesToB64url(credential.response.userHandle) : null,
    },
    clientExtensionResults: credential.getClientExtensionResults(),
  };
}

// Delegated: the sign-off form arrives inside an htmx fragment when the checks finish.
document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (form.id !== "sign-off") return;
  event.preventDefault();
  const problem = document.getElementById("sign-problem");
  problem.hidden = true;
  const decision = event.submitter ? event.submitter.value : "approve";
  const choices = {};
  document.querySelectorAll('input[type=radio][form="sign-off"]:checked').forEach((input) => {
    choices[input.name.replace("choice-", "")] = input.value;
  });
  // An overwrite is an override: its reason goes with it (only with it).
  const overrides = {};
  Object.entries(choices).forEach(([position, choice]) => {
    const words = document.querySelector(`textarea[form="sign-off"][name="override-${position}"]`);
    if (choice === "overwrite" && words) overrides[position] = words.value;
  });
  const buttons = form.querySelectorAll("button");
  buttons.forEach((b) => { b.disabled = true; });
  try {
    const begun = await post(form.dataset.begin, form,
                             {decision, choices, overrides, reason: form.elements.reason.value});
    const credential = await navigator.credentials.get({publicKey: requestOptions(begun.publicKey)});
    const done = await post(form.dataset.complete, form, {nonce: begun.nonce, credential: assertionJSON(credential)});
    window.location.assign(done.redirect);
  } catch (error) {
    problem.textContent = error.name === "NotAllowedError"
      ? "The passkey prompt was cancelled or timed out. Nothing was signed."
      : error.message;
    problem.hidden = false;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
});

// Without JavaScript the passkey buttons stay disabled: nothing can be signed or enrolled without it, and a
// click must never send the form (and its CSRF token) anywhere. Enabled here, and in fragments htmx brings.
function enablePasskeyButtons(root) {
  root.querySelectorAll("button[data-needs-js][disabled]").forEach((button) => { button.disabled = false; });
}
enablePasskeyButtons(document);
document.addEventListener("htmx:afterSettle", (event) => enablePasskeyButtons(event.target));
