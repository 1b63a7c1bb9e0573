package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app/audit"
	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// The store subcommands act on the configured store directly, not through
// a running idemproxy: accept-loss works while every replica refuses
// protected requests, and with none running.

const storeUsage = `Usage:
  idemproxy store accept-loss -config FILE [-operator NAME] [-reason TEXT]
  idemproxy store check -config FILE
  idemproxy store quarantine -config FILE [-operator NAME] [-reason TEXT]

accept-loss accepts that the configured store lost its keys (Redis restarted
empty or flushed, a PostgreSQL table truncated or restored, a Badger directory
replaced): it writes a new epoch marker, which every running replica adopts on
its next check (store.epoch_check_interval) and serves protected routes again.
Retries of keys answered before the loss are then forwarded again: check with
the upstream what was charged first (docs/operations.md, "The store lost its
keys"). It opens the store itself (Badger: only while no idemproxy holds the
directory; use the admin API, POST /v1/store/accept-loss, instead). It prints
the new epoch's ID on stdout and an audit line on stderr.
Exit status: 0 accepted, 1 the store could not be opened or written, 2 bad usage.

check reports why the configured Badger store does not open, without changing
it: damage in its reservation log, a MANIFEST missing or unreadable, files the
user cannot read or write, the directory held by a running process.
Exit status: 0 sound, 1 damaged or unreadable, 2 bad usage or not a Badger store.

quarantine moves the damaged segments of the Badger store's reservation log,
and every later one, aside into <dir>/idemproxy-wal-quarantine/, after which
the store opens with the records before them (a proxy that runs degraded opens
it within seconds). Reservations held in the set-aside records are lost:
retries of those requests are forwarded again, so check with the upstream what
was charged (docs/operations.md, "Runbook: the store does not open"). It prints
what it moved, and an audit line on stderr. Only while no idemproxy holds the
directory (a proxy whose store does not open does not hold it).
Exit status: 0 moved (or nothing to move), 1 failed or the damage is not in the
log, 2 bad usage or not a Badger store.

Flags:
`

// storeAcceptTimeout bounds opening the store and writing the marker.
const storeAcceptTimeout = time.Minute

// RunStore runs "idemproxy store ..." with args (after "store") and
// returns the exit status: 0 on success, 1 on a failure, 2 on bad usage.
func RunStore(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("idemproxy store", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, storeUsage)
		fs.PrintDefaults()
	}
	if len(args) > 0 && (args[0] == "check" || args[0] == "quarantine") {
		return runStoreFiles(args[0], args[1:], stdout, stderr, getenv)
	}
	if len(args) == 0 || args[0] != "accept-loss" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fs.Usage()
			return 0
		}
		fmt.Fprintf(stderr, "idemproxy store: want the subcommand accept-loss, check or quarantine (see idemproxy store -h)\n")
		return 2
	}
	configFlag := fs.String("config", "", "configuration `file` (default $"+config.PathEnv+", else ./config.yaml)")
	operator := fs.String("operator", audit.Operator(getenv), "who accepts the loss, for the audit log line")
	reason := fs.String("reason", "", "why, for the audit log line")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: unexpected arguments: %v (see idemproxy store -h)\n", fs.Args())
		return 2
	}
	path, _ := config.PathOf(*configFlag, getenv)
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: %s: %v\n", path, err)
		return 1
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	a := &app{log: log, cfg: cfg, getenv: getenv, path: path, settler: settle.New(log)}
	defer func() {
		now, cancel := context.WithCancel(context.Background())
		cancel()
		a.settler.Close(now)
	}()
	ctx, cancel := context.WithTimeout(ctx, storeAcceptTimeout)
	defer cancel()
	st, name, err := a.openStore(prometheus.NewRegistry())
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: open the store: %v\n", err)
		return 1
	}
	defer st.Close()
	if g, ok := st.(*badger.Guard); ok && g.OpenFailed() != nil {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: open the store: %v\n", g.OpenFailed())
		return 1
	}
	es, ok := st.(store.EpochStore)
	if !ok {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: the %s store keeps no epoch marker\n", name)
		return 1
	}
	old, acc, err := epoch.Accept(ctx, es, *operator, *reason, time.Now(), 0)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store accept-loss: %v\n", err)
		return 1
	}
	auditAcceptLoss(log, name, old, acc, *operator, *reason, "cli")
	fmt.Fprintln(stdout, acc.ID)
	return 0
}

// auditAcceptLoss writes the audit line of an accepted loss, as the admin
// API's release of a key does.
func auditAcceptLoss(log *slog.Logger, storeName string, old, acc *store.Epoch, operator, reason, via string) {
	prevID, prevState := "none", "none"
	if old != nil {
		prevID, prevState = old.ID, string(old.State)
	}
	log.Warn("store loss accepted by an operator: retries of keys answered before the loss will be forwarded again",
		"store", storeName, "epoch", acc.ID, "gen", acc.Gen, "previous_epoch", prevID, "previous_state", prevState,
		"operator", operator, "reason", reason, "via", via, "at", time.Now().UTC().Format(time.RFC3339Nano))
}
