package redis

import (
	"context"
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

// maxPipeline bounds the calls of one pipeline.
const maxPipeline = 64

// call is one queued script call.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	cmd    *goredis.Cmd
	done   chan struct{}
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
}

func newPipeliner(c goredis.UniversalClient, opTimeout time.Duration) *pipeliner {
	p := &pipeliner{client: c, opTimeout: opTimeout}
	p.q = batch.New(maxPipeline, p.send)
	return p
}

// run runs script like Script.Run, sharing a round trip with the calls
// queued at the same time; a call made while no other runs is sent at
// once. It returns when the reply is in or ctx ends.
func (p *pipeliner) run(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	defer p.calls.Add(-1)
	if p.calls.Add(1) == 1 {
		return script.Run(ctx, p.client, keys, args...) // alone: as send would
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	if !p.q.Put(c) {
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
	switch len(live) {
	case 0:
		return
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
