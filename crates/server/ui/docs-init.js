// Starts Swagger UI on this server's OpenAPI document. A file, not an
// inline script: /docs's Content-Security-Policy runs only this origin's.
'use strict';

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
});
