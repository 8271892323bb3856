// Loaded first in a copy of a page under test (web/browser_test.py): keeps every console error, uncaught exception,
// unhandled rejection and resource that failed to load, for the driver (web/browser_test_driver.js) to report.
"use strict";

window.tapegradTestErrors = [];
(function () {
  const keep = (text) => window.tapegradTestErrors.push(String(text));
  const consoleError = console.error.bind(console);
  console.error = (...args) => {
    keep("console.error: " + args.join(" "));
    consoleError(...args);
  };
  window.addEventListener("error", (e) => {
    if (e.target && e.target !== window && (e.target.src || e.target.href)) keep("not loaded: " + (e.target.src || e.target.href));
    else keep("uncaught: " + e.message + " at " + e.filename + ":" + e.lineno);
  }, true);
  window.addEventListener("unhandledrejection", (e) => keep("unhandled rejection: " + (e.reason && e.reason.stack || e.reason)));
})();
