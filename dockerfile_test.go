package main

import (
	"bufio"
	"debug/elf"
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
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
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
	return d
}

// TestDockerfileBuildsAStaticBinary runs the Dockerfile's own build command
// by hand (no Docker engine here) and checks that the binary it copies into
// the distroless image is static and reports the build's version.
func TestDockerfileBuildsAStaticBinary(t *testing.T) {
	d := readDockerfile(t)
	env := []string{}
	for _, ins := range d.stages["src"] {
		if kv, ok := strings.CutPrefix(ins, "ENV "); ok {
			env = append(env, strings.Fields(kv)...)
		}
	}
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Fatalf("the build stage does not set CGO_ENABLED=0: %v", env)
	}
	var build string
	for _, ins := range d.stages["build"] {
		if strings.HasPrefix(ins, "RUN go build") {
			build, _, _ = strings.Cut(strings.TrimPrefix(ins, "RUN "), "&&")
		}
	}
	if build == "" || !strings.Contains(build, "-trimpath") || !strings.Contains(build, "-o /out/idemproxy") {
		t.Fatalf("no 'RUN go build -trimpath ... -o /out/idemproxy' in the build stage: %q", build)
	}
	out := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(build, "/out/", out+"/"))
	cmd.Env = append(append(os.Environ(), env...), "VERSION=v9.9.9-test")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, b)
	}
	bin := filepath.Join(out, "idemproxy")
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
