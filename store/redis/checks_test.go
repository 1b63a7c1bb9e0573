package redis

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// TestPingEvictionPolicy checks that Ping (and so /readyz) refuses a Redis
// that may evict records, and accepts one that may not.
func TestPingEvictionPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // "" means Ping succeeds
	}{
		{"defaults", nil, ""},
		{"volatile-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"}, "maxmemory-policy is volatile-lru with maxmemory 104857600 bytes"},
		{"allkeys-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, "maxmemory-policy is allkeys-lru"},
		{"volatile-ttl", []string{"--maxmemory", "1gb", "--maxmemory-policy", "volatile-ttl"}, "maxmemory-policy is volatile-ttl"},
		{"noeviction", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, ""},
		{"no maxmemory", []string{"--maxmemory", "0", "--maxmemory-policy", "volatile-lru"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, tc.args...)
			s := newStore(t, Options{Addrs: []string{srv.Addr()}})
			err := s.Ping(ctx(t))
			t.Logf("Ping: %v", err)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Ping = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "noeviction") {
				t.Fatalf("Ping = %v; want an error containing %q that names the fix (noeviction)", err, tc.wantErr)
			}
			if !errors.Is(err, errEvictionPolicy) {
				t.Errorf("Ping = %v; want errors.Is ErrEvictionPolicy", err)
			}
			// Reservations are refused, naming the setting, and write
			// nothing.
			var se *store.SettingError
			if rec, err := s.Reserve(ctx(t), "k/evict", res); rec != nil || !errors.As(err, &se) || se.Setting != "maxmemory-policy" || !errors.Is(err, store.ErrUnsafeSettings) {
				t.Errorf("Reserve = %+v, %v; want a *store.SettingError for maxmemory-policy", rec, err)
			}
			if n, _ := srv.Do("DBSIZE"); n != "0" {
				t.Errorf("DBSIZE after the refused reservation = %s, want 0", n)
			}
			// AllowEviction serves.
			allow := newStore(t, Options{Addrs: []string{srv.Addr()}, AllowEviction: true})
			if err := allow.Ping(ctx(t)); err != nil {
				t.Errorf("Ping with AllowEviction = %v, want nil", err)
			}
			if rec, err := allow.Reserve(ctx(t), "k/evict", res); rec != nil || err != nil {
				t.Errorf("Reserve with AllowEviction = %+v, %v; want nil, nil", rec, err)
			}
			if got := allow.Risks()[riskEviction]; !strings.Contains(got, "maxmemory-policy") {
				t.Errorf("Risks()[eviction] with AllowEviction = %q, want what was seen", got)
			}
			// SkipEvictionCheck turns the check off.
			skip := newStore(t, Options{Addrs: []string{srv.Addr()}, SkipEvictionCheck: true})
			if err := skip.Ping(ctx(t)); err != nil {
				t.Errorf("Ping with SkipEvictionCheck = %v, want nil", err)
			}
		})
	}
}

// TestPingEvictionPolicyChangedAtRuntime checks that every Ping looks again:
// CONFIG SET can change the policy of a running Redis.
func TestPingEvictionPolicyChangedAtRuntime(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	c := ctx(t)
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	for _, kv := range [][2]string{{"maxmemory", "50mb"}, {"maxmemory-policy", "allkeys-lfu"}} {
		if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Ping(c); !errors.Is(err, errEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lfu") {
		t.Fatalf("Ping after CONFIG SET maxmemory-policy allkeys-lfu = %v; want ErrEvictionPolicy naming it", err)
	}
	if _, err := srv.Do("CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping after CONFIG SET maxmemory-policy noeviction = %v, want nil", err)
	}
}

// TestPingInfoRefused checks the error for an ACL user that may not run
// INFO: it names INFO and the way out.
func TestPingInfoRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all", "-info"); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, Username: "app", Password: "app-pw"})
	c := ctx(t)
	err := s.Ping(c)
	t.Logf("Ping: %v", err)
	if err == nil || !strings.Contains(err.Error(), "INFO") || !strings.Contains(err.Error(), "SkipEvictionCheck") {
		t.Fatalf("Ping for a user without INFO = %v; want an error naming INFO and SkipEvictionCheck", err)
	}
	s = newStore(t, Options{Addrs: []string{srv.Addr()}, Username: "app", Password: "app-pw", SkipEvictionCheck: true})
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping with SkipEvictionCheck for a user without INFO = %v, want nil", err)
	}
}

func TestJudge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r       nodeReport
		wantErr string
	}{
		{nodeReport{policy: "noeviction", aof: true}, ""},
		{nodeReport{policy: "allkeys-lru", aof: true}, ""},
		{nodeReport{policy: "noeviction", maxmemory: 1024, aof: true}, ""},
		{nodeReport{node: "n:1", policy: "volatile-random", maxmemory: 1024, aof: true}, "maxmemory-policy is volatile-random with maxmemory 1024 bytes on n:1"},
		{nodeReport{policy: "noeviction", save: "", saveKnown: true}, `appendonly is no, with save ""`},
		{nodeReport{policy: "noeviction", save: "3600 1", saveKnown: true}, ""},
		{nodeReport{policy: "noeviction"}, ""}, // CONFIG refused: not judged
	} {
		var got []string
		for _, r := range Risks {
			if e := judge(tc.r)[r]; e != nil {
				got = append(got, e.Error())
			}
		}
		if tc.wantErr == "" && len(got) > 0 || tc.wantErr != "" && (len(got) != 1 || !strings.Contains(got[0], tc.wantErr)) {
			t.Errorf("judge(%+v) = %q, want %q", tc.r, got, tc.wantErr)
		}
	}
}

// TestClusterMode addresses a Redis Cluster by one seed address, as an AWS
// ElastiCache configuration endpoint is: with ClusterMode the store uses
// the cluster client and works on every slot; without it, the address means
// a single node and Ping says what is wrong.
func TestClusterMode(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	seed := []string{c.Nodes[1].Addr()}
	s := newStore(t, Options{Addrs: seed, ClusterMode: true})
	if _, ok := s.client.(*goredis.ClusterClient); !ok {
		t.Fatalf("client for one address with ClusterMode is %T, want a cluster client", s.client)
	}
	cx := ctx(t)
	if err := s.Ping(cx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// Keys spread over the slots of all three nodes.
	const n = 30
	for i := range n {
		key := fmt.Sprintf("route/scope/key-%d", i)
		tok := fmt.Sprintf("tok-%d", i)
		if rec, err := s.Reserve(cx, key, store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); rec != nil || err != nil {
			t.Fatalf("Reserve(%s) = %+v, %v; want nil, nil", key, rec, err)
		}
		if err := s.Commit(cx, key, tok, store.Response{Status: 200 + i, BodyStored: true}, time.Hour); err != nil {
			t.Fatalf("Commit(%s): %v", key, err)
		}
	}
	for i := range n {
		key := fmt.Sprintf("route/scope/key-%d", i)
		rec, err := s.Get(cx, key)
		if err != nil || rec == nil || rec.State != store.StateCompleted || rec.Response.Status != 200+i {
			t.Fatalf("Get(%s) = %+v, %v; want completed with status %d", key, rec, err, 200+i)
		}
	}
	for _, node := range c.Nodes {
		if got, err := node.Do("DBSIZE"); err != nil || got == "0" {
			t.Errorf("DBSIZE on %s = %q, %v; want the %d keys spread over all nodes", node.Addr(), got, err, n)
		}
	}

	// Without ClusterMode one address is a single node, and Ping refuses
	// a Cluster node rather than let most keys fail with MOVED.
	single := newStore(t, Options{Addrs: seed})
	if _, ok := single.client.(*goredis.Client); !ok {
		t.Fatalf("client for one address without ClusterMode is %T, want a single-node client", single.client)
	}
	err := single.Ping(cx)
	t.Logf("Ping of a Cluster node as a single node: %v", err)
	if err == nil || !strings.Contains(err.Error(), "Redis Cluster") || !strings.Contains(err.Error(), "cluster mode") {
		t.Errorf("Ping of a Cluster node without ClusterMode = %v; want an error that names cluster mode", err)
	}

	// One master that may evict fails the Cluster's Ping, naming the node.
	bad := c.Nodes[2]
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "volatile-lru"}} {
		if _, err := bad.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	err = s.Ping(cx)
	t.Logf("Ping with one evicting master: %v", err)
	if !errors.Is(err, errEvictionPolicy) || !strings.Contains(err.Error(), bad.Addr()) || !strings.Contains(err.Error(), "volatile-lru") {
		t.Errorf("Ping with volatile-lru on %s = %v; want ErrEvictionPolicy naming the node and the policy", bad.Addr(), err)
	}
}

// TestClusterModeOnPlainNode checks that ClusterMode on a node that is not
// in a Cluster fails Ping instead of working by accident.
func TestClusterModeOnPlainNode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, ClusterMode: true})
	if err := s.Ping(ctx(t)); err == nil {
		t.Fatal("Ping with ClusterMode on a plain node succeeded, want an error")
	} else {
		t.Logf("Ping: %v", err)
	}
}

// TestSentinelAuth runs the store through a Sentinel that wants its own
// credentials, different from the master's.
func TestSentinelAuth(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	sen := redistest.StartSentinel(t, master, "mymaster")
	for _, cmd := range [][]string{
		{"SENTINEL", "SET", "mymaster", "auth-pass", "master-pw"},
		{"ACL", "SETUSER", "sentinel-user", "on", ">sentinel-pw", "+@all"},
		{"ACL", "SETUSER", "default", "off"},
	} {
		if _, err := sen.Do(cmd...); err != nil {
			t.Fatalf("%v on the sentinel: %v", cmd, err)
		}
	}
	if _, err := master.Do("CONFIG", "SET", "requirepass", "master-pw"); err != nil {
		t.Fatal(err)
	}
	base := Options{Addrs: []string{sen.Addr()}, MasterName: "mymaster", Password: "master-pw"}
	c := ctx(t)

	withAuth := base
	withAuth.SentinelUsername, withAuth.SentinelPassword = "sentinel-user", "sentinel-pw"
	s := newStore(t, withAuth)
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping through the sentinel with its credentials: %v", err)
	}
	if rec, err := s.Reserve(c, "k/sentinel", res); rec != nil || err != nil {
		t.Fatalf("Reserve = %+v, %v; want nil, nil", rec, err)
	}
	if rec, err := s.Get(c, "k/sentinel"); err != nil || rec == nil || rec.State != store.StateInFlight {
		t.Fatalf("Get = %+v, %v; want the in-flight record", rec, err)
	}
	if _, err := master.Do("PING"); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING on the master without its password = %v; want NOAUTH (the test must use two sets of credentials)", err)
	}

	without := newStore(t, Options{Addrs: base.Addrs, MasterName: base.MasterName, Password: base.Password, OpTimeout: 2 * time.Second})
	if err := without.Ping(c); err == nil {
		t.Error("Ping through the sentinel without its credentials succeeded, want an error")
	} else {
		t.Logf("Ping without sentinel credentials: %v", err)
	}
}

func TestUniversalOptions(t *testing.T) {
	t.Parallel()
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	got := universalOptions(Options{
		Addrs:            []string{"a:1"},
		ClusterMode:      true,
		Username:         "u",
		Password:         "p",
		SentinelUsername: "su",
		SentinelPassword: "sp",
		DB:               0,
		TLS:              tlsConf,
		DialTimeout:      time.Second,
		OpTimeout:        3 * time.Second,
	})
	want := &goredis.UniversalOptions{
		Addrs:                 []string{"a:1"},
		IsClusterMode:         true,
		Username:              "u",
		Password:              "p",
		SentinelUsername:      "su",
		SentinelPassword:      "sp",
		TLSConfig:             tlsConf,
		ClientName:            "idemproxy",
		DialTimeout:           time.Second,
		DialerRetries:         1,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		ContextTimeoutEnabled: true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("universalOptions =\n%+v\nwant\n%+v", got, want)
	}
	// The Sentinel credentials reach go-redis' failover options.
	fo := universalOptions(Options{Addrs: []string{"s:1"}, MasterName: "m", SentinelUsername: "su", SentinelPassword: "sp"}).Failover()
	if fo.SentinelUsername != "su" || fo.SentinelPassword != "sp" || fo.MasterName != "m" {
		t.Errorf("failover options: sentinel user %q, password %q, master %q; want su, sp, m", fo.SentinelUsername, fo.SentinelPassword, fo.MasterName)
	}
}

// TestTLSPrivateCA connects over TLS to a Redis whose certificate, for
// "localhost" only, comes from a private CA: a tls.Config with just RootCAs
// works, because the ServerName is taken from the address dialled, and the
// same config fails for an address the certificate does not name.
func TestTLSPrivateCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, certFile, keyFile, pool := makeCerts(t, dir, "localhost")
	tlsPort := freeTCPPort(t)
	redistest.Start(t,
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", certFile,
		"--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no",
	)
	c := ctx(t)

	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	s := newStore(t, Options{Addrs: []string{net.JoinHostPort("localhost", strconv.Itoa(tlsPort))}, TLS: conf})
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping over TLS to localhost: %v", err)
	}
	if rec, err := s.Reserve(c, "k/tls", res); rec != nil || err != nil {
		t.Fatalf("Reserve over TLS = %+v, %v; want nil, nil", rec, err)
	}
	if conf.ServerName != "" {
		t.Errorf("the caller's tls.Config was changed: ServerName %q", conf.ServerName)
	}

	// 127.0.0.1 is not in the certificate: the host is verified.
	bad := newStore(t, Options{Addrs: []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))}, TLS: conf, OpTimeout: 2 * time.Second})
	err := bad.Ping(c)
	t.Logf("Ping over TLS to 127.0.0.1: %v", err)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Ping over TLS to an address the certificate does not name = %v; want a certificate error", err)
	}
}

// makeCerts writes a CA and a server certificate for host into dir.
func makeCerts(t *testing.T, dir, host string) (caFile, certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idemproxy test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER), pool
}

// freeTCPPort returns a loopback port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
