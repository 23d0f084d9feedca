// Starts Swagger UI on /docs: a file of its own, not an inline script, so the page's
// Content-Security-Policy can refuse inline scripts.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    // "Try it out" calls the API from the browser: the key typed under "Authorize" is
    // sent as `Authorization: Bearer <key>`, and is forgotten on reload.
    persistAuthorization: false,
    displayRequestDuration: true,
    // No validator badge (an image from validator.swagger.io, which the standalone layout
    // shows for a document on any host but localhost): nothing comes from another host.
    validatorUrl: null,
  });
});
