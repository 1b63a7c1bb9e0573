// Package app runs the proxy: it wires the configuration to a store, the
// proxy handler, the admission limits and the admin listener, serves until
// its context ends, reloads on SIGHUP or POST /-/reload, and shuts down
// gracefully. It also runs "idemproxy store ...", which opens the store
// as the proxy does. The command line that calls it is internal/app/cli.
package app
