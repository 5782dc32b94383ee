// Starts Swagger UI on this server's OpenAPI document. A file, not an
// inline script: /docs's Content-Security-Policy runs only this origin's.
'use strict';

// Where the web UI keeps its token (app.js): this tab's session storage,
// or the browser's when "Remember" was ticked. Both are this origin's.
const TOKEN_KEY = 'cordon.token';

window.ui = SwaggerUIBundle({
  url: '/openapi.json',
  dom_id: '#swagger-ui',
  layout: 'BaseLayout',
  presets: [SwaggerUIBundle.presets.apis],
  deepLinking: true,
  // No badge from the public validator: the page talks to this origin only.
  validatorUrl: null,
  // ?url=... never swaps in another document (explicit: it is the default).
  queryConfigEnabled: false,
  // The document names no servers, so "Try it out" sends to this origin;
  // the token given to "Authorize" lives in this page's memory only.
  persistAuthorization: false,
  displayRequestDuration: true,
  defaultModelsExpandDepth: 0,
  // Signed in to the web UI: "Authorize" starts with that token, read
  // from storage, never written back.
  onComplete() {
    const token = sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY);
    if (token) window.ui.preauthorizeApiKey('bearer', token);
  },
});
