package e2e

import (
	"bufio"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dockerfile is the Dockerfile, its continuation lines joined, split into
// instructions per stage.
type dockerfile struct {
	stages map[string][]string // stage name -> instructions
	last   string              // the default target
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	d, err := parseDockerfile()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func parseDockerfile() (dockerfile, error) {
	f, err := os.Open("Dockerfile")
	if err != nil {
		return dockerfile{}, err
	}
	defer f.Close()
	d := dockerfile{stages: map[string][]string{}}
	var cur, stage string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur += rest + " "
			continue
		}
		cur += line
		if m := regexp.MustCompile(`(?i)^FROM\s+\S+\s+AS\s+(\S+)`).FindStringSubmatch(cur); m != nil {
			stage = m[1]
			d.last = stage
		} else {
			d.stages[stage] = append(d.stages[stage], cur)
		}
		cur = ""
	}
	return d, sc.Err()
}

// buildCommand returns the build stage's environment and its go build
// command.
func (d dockerfile) buildCommand() (env []string, build string, err error) {
	for _, ins := range d.stages["src"] {
		if kv, ok := strings.CutPrefix(ins, "ENV "); ok {
			env = append(env, strings.Fields(kv)...)
		}
	}
	if !slices.Contains(env, "CGO_ENABLED=0") {
		return nil, "", fmt.Errorf("the build stage does not set CGO_ENABLED=0: %v", env)
	}
	for _, ins := range d.stages["build"] {
		if strings.HasPrefix(ins, "RUN go build") {
			build, _, _ = strings.Cut(strings.TrimPrefix(ins, "RUN "), "&&")
		}
	}
	if build == "" || !strings.Contains(build, "-trimpath") || !strings.Contains(build, "-o /out/idemproxy") {
		return nil, "", fmt.Errorf("no 'RUN go build -trimpath ... -o /out/idemproxy' in the build stage: %q", build)
	}
	return env, build, nil
}

// staticBuild is the Dockerfile's build, which compiles every package
// again (static and with -trimpath: about 50 s on a fresh machine, a few
// seconds from the build cache). TestMain starts it in the background when
// TestDockerfileBuildsAStaticBinary is to run, so that the compile overlaps
// the package's other tests instead of holding them up.
var staticBuild struct {
	done  chan struct{}
	build string
	bin   string
	out   []byte
	err   error
}

// startStaticBuild starts the Dockerfile's build into dir, unless the
// -run and -skip flags leave TestDockerfileBuildsAStaticBinary out. It
// returns a function that waits for the build to end.
func startStaticBuild(dir string) (wait func()) {
	const name = "TestDockerfileBuildsAStaticBinary"
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		if ok, _ := regexp.MatchString(strings.Split(f.Value.String(), "/")[0], name); !ok {
			return func() {}
		}
	}
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		if ok, _ := regexp.MatchString(strings.Split(f.Value.String(), "/")[0], name); ok {
			return func() {}
		}
	}
	b := &staticBuild
	b.done = make(chan struct{})
	go func() {
		defer close(b.done)
		d, err := parseDockerfile()
		if err != nil {
			b.err = err
			return
		}
		env, build, err := d.buildCommand()
		if err != nil {
			b.err = err
			return
		}
		b.build, b.bin = build, filepath.Join(dir, "idemproxy")
		cmd := exec.Command("sh", "-c", strings.ReplaceAll(build, "/out/", dir+"/"))
		cmd.Env = append(append(os.Environ(), env...), "VERSION=v9.9.9-test")
		b.out, b.err = cmd.CombinedOutput()
	}()
	return func() { <-b.done }
}

// TestDockerfileBuildsAStaticBinary runs the Dockerfile's own build command
// by hand (no Docker engine here) and checks that the binary it copies into
// the distroless image is static and reports the build's version.
//
// It is parallel so that it runs after the package's serial tests, by
// which time the build is done or nearly.
func TestDockerfileBuildsAStaticBinary(t *testing.T) {
	t.Parallel()
	b := &staticBuild
	if b.done == nil {
		t.Fatal("TestMain did not start the Dockerfile's build")
	}
	<-b.done
	if b.err != nil {
		t.Fatalf("%s: %v\n%s", b.build, b.err, b.out)
	}
	bin := b.bin
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary is dynamically linked (%v): distroless/static cannot run it", p.Type)
		}
	}
	v, err := exec.Command(bin, "-version").Output()
	if err != nil || !strings.Contains(string(v), "v9.9.9-test") {
		t.Errorf("-version = %q, %v; want the build's VERSION", v, err)
	}
	if b, err := exec.Command(bin, "-check", "-config", "deploy/container-config.yaml").CombinedOutput(); err != nil {
		t.Errorf("the image's configuration does not validate: %v\n%s", err, b)
	}
}

// TestDockerfileRuntime checks the runtime image: non-root, both ports, the
// data volume, and a health check that uses the binary itself.
func TestDockerfileRuntime(t *testing.T) {
	t.Parallel()
	d := readDockerfile(t)
	if d.last != "idemproxy" {
		t.Errorf("the default target is %q, want idemproxy", d.last)
	}
	final := strings.Join(d.stages[d.last], "\n")
	for _, want := range []string{
		"USER 65532:65532",
		"EXPOSE 8080 9091",
		"VOLUME /var/lib/idemproxy",
		`HEALTHCHECK`, `CMD ["/usr/local/bin/idemproxy", "-healthcheck", "http://127.0.0.1:9091/livez"]`,
		`ENTRYPOINT ["/usr/local/bin/idemproxy"]`,
		"org.opencontainers.image.source=",
		"COPY --from=build /out/idemproxy /usr/local/bin/idemproxy",
	} {
		if !strings.Contains(final, want) {
			t.Errorf("the runtime stage has no %q", want)
		}
	}
}
