//go:build unix

package stub

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a writing process and a reading test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestBinaryStopsOnSIGTERM builds the real upstream-stub binary (the parent
// directory), serves a charge with it,
// and checks that SIGTERM lets an in-flight request finish and exits 0.
func TestBinaryStopsOnSIGTERM(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to build the binary: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "upstream-stub")
	if out, err := exec.Command(goTool, "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0", "-addr-file", addrFile)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	waitErr := make(chan error, 1)
	go func() {
		waitErr <- cmd.Wait()
		close(exited)
	}()
	addr := waitAddrFile(t, addrFile, exited)
	base := "http://" + addr

	if m := regexp.MustCompile(`"msg":"upstream-stub listening","addr":"([^"]+)"`).FindStringSubmatch(stderr.String()); m == nil || m[1] != addr {
		t.Errorf("the log does not announce addr=%s:\n%s", addr, stderr)
	}

	client := &http.Client{Timeout: 10 * time.Second}
	r := send(t, client, "POST", base+"/charges", `{"orderId": "BIN-1", "amount": 9.99}`, nil)
	wantCharge(t, r, "BIN-1", "9.99")

	// A delayed charge is in flight when SIGTERM arrives; the graceful
	// shutdown lets it finish.
	type result struct {
		r   response
		err error
	}
	inFlight := make(chan result, 1)
	go func() {
		r, err := trySend(client, "POST", base+"/charges", `{"orderId": "BIN-1", "amount": 1}`,
			map[string]string{headerFault: faultDelay, headerDelay: "500ms"})
		inFlight <- result{r, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := decode[statement](t, send(t, client, "GET", base+"/orders/BIN-1/charges", "", nil))
		if st.Charges == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the delayed charge was not recorded within 10s: %+v", st)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("send SIGTERM: %v", err)
	}
	select {
	case res := <-inFlight:
		if res.err != nil {
			t.Errorf("the in-flight delayed charge failed during shutdown: %v", res.err)
		} else {
			wantCharge(t, res.r, "BIN-1", "1")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the in-flight delayed charge got no answer within 10s")
	}
	select {
	case err := <-waitErr:
		if err != nil {
			t.Errorf("the binary exited with %v, want exit status 0; log:\n%s", err, stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the binary did not exit within 15s of SIGTERM")
	}
	for _, want := range []string{`"msg":"upstream-stub shutting down"`, `"msg":"upstream-stub stopped"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the log does not contain %s:\n%s", want, stderr)
		}
	}
}

// waitAddrFile waits for the -addr-file of a starting server and returns the
// address in it.
func waitAddrFile(t *testing.T, path string, exited <-chan struct{}) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			return strings.TrimSpace(string(b))
		}
		select {
		case <-exited:
			t.Fatal("the server exited before it wrote its address")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address in %s after 10s: %v", path, err)
		}
	}
}
