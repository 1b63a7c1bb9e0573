package cli

import (
	"flag"
	"fmt"

	"github.com/idemproxy/idemproxy/config"
)

// exampleConfigURL is where a user without the repository finds the
// documented example configuration.
const exampleConfigURL = "https://github.com/idemproxy/idemproxy/blob/main/config.example.yaml"

// usage writes -h's answer: what the binary does, examples, where the
// example configuration is, then the subcommands and the flags.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, `idemproxy is a sidecar reverse proxy that makes an HTTP service idempotent: a
request retried with the same idempotency key reaches the service once, and the
retry gets the stored answer.

Examples:
  idemproxy -config config.yaml           run the proxy
  idemproxy -config config.yaml -check    validate the configuration and exit
  idemproxy -config config.yaml -listen 127.0.0.1:18080 -upstream http://127.0.0.1:9000
                                          the same, on other addresses (or $IDEMPROXY_LISTEN,
                                          $IDEMPROXY_ADMIN_LISTEN, $IDEMPROXY_UPSTREAM)
  IDEMPROXY_ADMIN_TOKEN=... idemproxy keys list charges -state in_doubt

Configuration: -config, else $%s, else ./config.yaml. Start from
config.example.yaml, the reference of every option: at the root of the
repository (%s)
and at /etc/idemproxy/config.example.yaml in the container image.

Usage:
  idemproxy [flags]
  idemproxy keys list|show|release|reconcile ...   keys through the admin API (idemproxy keys -h)
  idemproxy reload                                 apply the configuration file again (idemproxy reload -h)
  idemproxy store accept-loss -config FILE ...     accept that the store lost its keys (idemproxy store -h)
  idemproxy store check -config FILE              say why the Badger store does not open
  idemproxy store quarantine -config FILE ...      move its damaged log segments aside (idemproxy store -h)

Flags:
`, config.PathEnv, exampleConfigURL)
	fs.PrintDefaults()
}
