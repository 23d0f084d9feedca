"""The operator console at /console: server-rendered pages, live updates, guarded actions.

`groupbuy.console.app.console_routes` gives the routes the API app mounts; everything the
console shows comes from the services, never from the HTTP API.
"""
