package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/batch"
)

// Pipelining.
//
// Every script call of the store goes through one pipeliner: a goroutine
// that takes the calls queued while the previous round trip was on the
// wire (up to maxPipeline) and sends them to Redis as one pipeline of
// EVALSHAs: one write and one read for all of them, instead of one each.
// Each call still gets its own reply, so one call's error (a script error,
// NOSCRIPT) never fails another. A call alone is sent as it always was
// (Script.Run), by its own caller when no other call is running at all. Pipelined scripts are safe to resend for the same reason
// single ones are (go-redis retries a pipeline that failed on the network):
// each checks the caller's owner token.

// Waiting for replicas (Options.WaitReplicas).
//
// Redis replicates asynchronously: a write it acknowledged may not have
// reached any replica when the primary dies, and a failover then promotes a
// replica that never saw it. With WaitReplicas set, every batch holding a
// write (a reservation, commit, release or in-doubt mark) is sent as one
// pipeline ending in WAIT <n> <ms> on the same connection: WAIT answers
// how many replicas acknowledged every write made on that connection
// before it, so one WAIT covers the whole batch. When fewer than n
// acknowledged, every write of the batch fails with errNotReplicated: a
// reservation is not forwarded (the caller answers 503 and releases the
// key, which the primary applies if it still lives), a commit follows the
// commit-failure path. The writes stay on the primary: a primary that
// survives keeps them, and a failover to a replica that never acknowledged
// them is what the error warned of. Reads (Get) are then not pipelined:
// each is sent at once, so that it never waits behind a WAIT.

// errNotReplicated is returned (wrapped) by a write when fewer replicas
// than Options.WaitReplicas acknowledged it within Options.WaitTimeout.
// The write was applied on the primary, and may be lost in a failover.
var errNotReplicated = errors.New("fewer replicas acknowledged the write than wait_replicas asks")

// maxPipeline bounds the calls of one pipeline.
const maxPipeline = 64

// call is one queued script call.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	// write is set for a call that may write a record: it waits for the
	// replicas (Options.WaitReplicas).
	write bool
	cmd   *goredis.Cmd
	done  chan struct{}
}

type pipeliner struct {
	client    goredis.UniversalClient
	q         *batch.Queue[*call]
	opTimeout time.Duration
	// calls is the number of calls being run: a call that finds no other
	// is sent by its caller at once, without the hand-off to the
	// pipeliner's goroutine and back (two goroutine wake-ups, tens of
	// microseconds of latency when the proxy is not loaded).
	calls atomic.Int64
	// waitReplicas and waitTimeout are Options.WaitReplicas and
	// WaitTimeout: 0 replicas sends no WAIT. With auto (Options.WaitAuto)
	// the writes wait for one replica while replicas, the master's
	// connected replicas as the settings checks last read them, is above
	// 0 (setReplicas).
	waitReplicas int
	auto         bool
	replicas     atomic.Int64
	waitTimeout  time.Duration
	// waitFailures counts the writes failed with errNotReplicated.
	waitFailures atomic.Uint64
}

func newPipeliner(c goredis.UniversalClient, opTimeout time.Duration, waitReplicas int, auto bool, waitTimeout time.Duration) *pipeliner {
	p := &pipeliner{client: c, opTimeout: opTimeout, waitReplicas: waitReplicas, auto: auto, waitTimeout: waitTimeout}
	p.q = batch.New(maxPipeline, p.send)
	return p
}

// setReplicas records n, the replicas the master reports connected, for
// auto.
func (p *pipeliner) setReplicas(n int) { p.replicas.Store(int64(n)) }

// want is the number of replicas a write waits for now.
func (p *pipeliner) want() int {
	if p.auto {
		return int(min(p.replicas.Load(), 1))
	}
	return p.waitReplicas
}

// run runs script like Script.Run, sharing a round trip with the calls
// queued at the same time; a call made while no other runs is sent at
// once. It returns when the reply is in or ctx ends. write says that the
// script may write a record: with WaitReplicas set, it then waits for the
// replicas.
func (p *pipeliner) run(ctx context.Context, write bool, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	want := p.want()
	if !write && want > 0 {
		// Not queued behind a pipeline that waits for the replicas (up to
		// WaitTimeout, longer than the read's OpTimeout may last): a read
		// answers whatever the replicas do.
		return script.Run(ctx, p.client, keys, args...)
	}
	defer p.calls.Add(-1)
	waits := write && want > 0
	if p.calls.Add(1) == 1 {
		if waits { // alone: as send would
			c := &call{ctx: ctx, script: script, keys: keys, args: args, write: true}
			p.sendWaiting(ctx, []*call{c}, want)
			return c.cmd
		}
		return script.Run(ctx, p.client, keys, args...) // alone: as send would
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, write: write, done: make(chan struct{})}
	if !p.q.Put(c) {
		if waits {
			p.sendWaiting(ctx, []*call{c}, want) // closed: fails on the closed client
			return c.cmd
		}
		return script.Run(ctx, p.client, keys, args...) // closed: fails on the closed client
	}
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		// The call may still be applied, as with a reply lost on the
		// network: the caller treats the error so.
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(context.Cause(ctx))
		return cmd
	}
}

func (p *pipeliner) close() { p.q.Close() }

// send sends batch and answers each call.
func (p *pipeliner) send(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil { // its caller has gone: do not send it now
			c.cmd = goredis.NewCmd(c.ctx)
			c.cmd.SetErr(err)
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if want := p.want(); want > 0 && hasWrite(live) {
		// The pipeline gets a whole op timeout and wait timeout of its
		// own, as below.
		ctx, cancel := context.WithTimeout(context.Background(), p.opTimeout+p.waitTimeout)
		defer cancel()
		p.sendWaiting(ctx, live, want)
		for _, c := range live {
			close(c.done)
		}
		return
	}
	switch len(live) {
	case 1:
		c := live[0]
		c.cmd = c.script.Run(c.ctx, p.client, c.keys, c.args...)
		close(c.done)
		return
	}
	// The pipeline gets a whole op timeout of its own: a call that waited
	// in the queue must not cut it short for the others (each caller still
	// stops waiting at its own deadline).
	ctx, cancel := context.WithTimeout(context.Background(), p.opTimeout)
	defer cancel()
	pipe := p.client.Pipeline()
	for _, c := range live {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	pipe.Exec(ctx) // each command carries its own error
	for _, c := range live {
		if err := c.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			c.cmd = c.script.Run(c.ctx, p.client, c.keys, c.args...) // loads it
		}
		close(c.done)
	}
}

// hasWrite reports whether a call of calls may write.
func hasWrite(calls []*call) bool {
	for _, c := range calls {
		if c.write {
			return true
		}
	}
	return false
}

// sendWaiting sends calls as one pipeline ending in WAIT (see "Waiting for
// replicas") and sets each call's cmd; it does not close done. Scripts
// Redis has forgotten (NOSCRIPT) are sent again with their body, followed
// by a WAIT of their own.
func (p *pipeliner) sendWaiting(ctx context.Context, calls []*call, want int) {
	p.pipeWait(ctx, calls, false, want)
	var again []*call
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		p.pipeWait(ctx, again, true, want)
	}
}

// pipeWait sends calls (by SHA, or with their bodies when eval is set)
// and a WAIT in one pipeline, and fails every write of calls when fewer
// than want replicas acknowledged.
func (p *pipeliner) pipeWait(ctx context.Context, calls []*call, eval bool, want int) {
	pipe := p.client.Pipeline()
	for _, c := range calls {
		if eval {
			c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	wait := pipe.Do(ctx, "wait", want, millis(p.waitTimeout))
	pipe.Exec(ctx) // each command carries its own error
	n, err := wait.Int64()
	if err == nil && n >= int64(want) {
		return
	}
	if err != nil {
		err = fmt.Errorf("%w: WAIT: %w", errNotReplicated, err)
	} else {
		err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v", errNotReplicated, n, want, p.waitTimeout)
	}
	for _, c := range calls {
		if c.write && c.cmd.Err() == nil {
			c.cmd.SetErr(err)
			p.waitFailures.Add(1)
		}
	}
}
