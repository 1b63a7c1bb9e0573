package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app/audit"
	"github.com/idemproxy/idemproxy/store/badger"
)

// The store subcommands that read and repair the embedded store's files
// (check, quarantine): they act on the directory, without opening Badger.

// storeLockWait is how long quarantine waits for the store's directory
// lock: a proxy whose store does not open takes it for a moment each time
// it tries again.
const storeLockWait = 10 * time.Second

// runStoreFiles runs "idemproxy store check" or "idemproxy store
// quarantine" (sub) and returns the exit status.
func runStoreFiles(sub string, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("idemproxy store "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, storeUsage)
		fs.PrintDefaults()
	}
	configFlag := fs.String("config", "", "configuration `file` (default $"+config.PathEnv+", else ./config.yaml)")
	var operator, reason *string
	if sub == "quarantine" {
		operator = fs.String("operator", audit.Operator(getenv), "who moves the segments aside, for the audit log line")
		reason = fs.String("reason", "", "why, for the audit log line")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemproxy store %s: unexpected arguments: %v (see idemproxy store -h)\n", sub, fs.Args())
		return 2
	}
	path, _ := config.PathOf(*configFlag, getenv)
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store %s: %s: %v\n", sub, path, err)
		return 1
	}
	if cfg.Store.Badger == nil {
		name := cfg.Store.Kind()
		fmt.Fprintf(stderr, "idemproxy store %s: %s configures the %s store; check and quarantine are for the embedded Badger store only (a %s store that fails is the server's: see docs/%s.md)\n", sub, path, name, name, name)
		return 2
	}
	dir := cfg.Store.Badger.Dir
	if sub == "check" {
		return storeCheck(dir, path, stdout, stderr)
	}
	return storeQuarantine(dir, path, *operator, *reason, stdout, stderr)
}

// storeCheck reports what is wrong with the Badger store in dir: 0 sound,
// 1 damaged or unreadable.
func storeCheck(dir, cfgPath string, stdout, stderr io.Writer) int {
	fmt.Fprintf(stdout, "store: badger, directory %s\n", dir)
	bad := false
	rep, err := badger.Check(dir)
	switch {
	case err != nil:
		bad = true
		fmt.Fprintf(stdout, "reservation log: UNREADABLE: %v\n", err)
	case rep.OK():
		fmt.Fprintf(stdout, "reservation log: sound (%d segments, %d records)\n", rep.Segments, rep.Records)
	default:
		bad = true
		fmt.Fprintf(stdout, "reservation log: DAMAGED (%d segments, %d valid records before the damage)\n", rep.Segments, rep.Records)
		for _, d := range rep.Damage {
			fmt.Fprintf(stdout, "  %s\n", describeDamage(d))
		}
	}
	probs := badger.CheckFiles(dir)
	if len(probs) == 0 {
		fmt.Fprintln(stdout, "files: sound (MANIFEST, permissions, not in use)")
	}
	for _, p := range probs {
		bad = true
		fmt.Fprintf(stdout, "files: %s\n", p)
	}
	if !bad {
		fmt.Fprintln(stdout, "verdict: sound")
		return 0
	}
	fmt.Fprintln(stdout, "verdict: the store does not open; docs/operations.md, \"Runbook: the store does not open\", says what to do")
	if err == nil && !rep.OK() {
		fmt.Fprintf(stdout, "to open it with the records before the damage (the reservations after it are lost: check with the upstream):\n  idemproxy store quarantine -config %s -operator NAME -reason TEXT\n", cfgPath)
	}
	return 1
}

// describeDamage says where a damaged place of the log is.
func describeDamage(d badger.Damage) string {
	where := d.Segment
	if where != "" {
		where = fmt.Sprintf("%s at offset %d (sequence %d): ", d.Segment, d.Offset, d.Seq)
	}
	return where + d.Detail
}

// storeQuarantine moves the damaged segments of the store's log in dir
// aside, holding the directory's lock, and writes the audit line.
func storeQuarantine(dir, cfgPath, operator, reason string, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	// The lock keeps a degraded proxy from trying the store while it is
	// checked; Quarantine takes it again itself.
	unlock, err := badger.LockDir(dir, storeLockWait)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store quarantine: %v\n", err)
		return 1
	}
	before, err := badger.Check(dir)
	unlock()
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store quarantine: %v\n", err)
		return 1
	}
	if before.OK() {
		fmt.Fprintf(stdout, "nothing to quarantine: the reservation log in %s is sound (%d segments, %d records)\n", dir, before.Segments, before.Records)
		bad := false
		for _, p := range badger.CheckFiles(dir) {
			if !p.InUse { // a proxy trying the store meanwhile
				bad = true
				fmt.Fprintf(stdout, "files: %s\n", p)
			}
		}
		if bad {
			fmt.Fprintf(stdout, "what keeps the store from opening is not in the log; see idemproxy store check -config %s\n", cfgPath)
			return 1
		}
		return 0
	}
	q, err := badger.Quarantine(dir, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store quarantine: %v\n", err)
		return 1
	}
	after, err := badger.Check(dir)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy store quarantine: after moving: %v\n", err)
		return 1
	}
	// The valid records after the damage, moved aside with their
	// segments (Quarantined.SetAside): the records before it are kept.
	setAside := q.SetAside
	for _, seg := range q.Segments {
		fmt.Fprintf(stdout, "moved %s to %s\n", seg, q.Dir)
	}
	fmt.Fprintf(stdout, "set aside: %d segments, holding %d valid records after the damage; %d records kept\n",
		len(q.Segments), setAside, after.Records)
	fmt.Fprintln(stdout, "requests whose reservations were in the set-aside records are forwarded again when retried: check with the upstream what was charged")
	log.Warn("reservation log segments quarantined by an operator: requests whose reservations they held are forwarded again when retried",
		"store", "badger", "dir", dir, "quarantine_dir", q.Dir, "segments", len(q.Segments), "records_set_aside", setAside,
		"records_kept", after.Records, "operator", operator, "reason", reason, "via", "cli",
		"at", time.Now().UTC().Format(time.RFC3339Nano))
	if !after.OK() {
		fmt.Fprintf(stdout, "the log is still damaged: run idemproxy store check -config %s\n", cfgPath)
		return 1
	}
	return 0
}
