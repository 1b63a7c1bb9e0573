package e2e

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemproxy/idemproxy/config"
)

// TestKustomizeOverlaysRenderAndCheck renders deploy/kubernetes with every
// combination of its components (a store: none, redis, postgres; scraping:
// none, the PodMonitor, the prometheus.io annotations) with kubectl
// kustomize, and runs -check on each rendered configuration: the base
// asks for nothing a bare cluster lacks (no PodMonitor), never combines
// the two ways of being scraped, and every ConfigMap it can render loads,
// with config.watch on.
func TestKustomizeOverlaysRenderAndCheck(t *testing.T) {
	t.Parallel()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is needed to render deploy/kubernetes (Debian: apt-get install kubernetes-client)")
	}
	base, err := filepath.Abs("deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	for _, storeComp := range []string{"", "redis", "postgres"} {
		for _, scrape := range []string{"", "components/podmonitor", "components/prometheus-annotations"} {
			name := strings.Trim(storeComp+"+"+filepath.Base(scrape), "+.")
			if name == "" {
				name = "base"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				rel, err := filepath.Rel(dir, base) // kustomize refuses absolute paths
				if err != nil {
					t.Fatal(err)
				}
				k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel + "\n"
				if storeComp != "" || scrape != "" {
					k += "components:\n"
					for _, c := range []string{storeComp, scrape} {
						if c != "" {
							k += "  - " + rel + "/" + c + "\n"
						}
					}
				}
				if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(kubectl, "kustomize", dir).Output()
				if err != nil {
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						t.Fatalf("kubectl kustomize: %v\n%s", err, ee.Stderr)
					}
					t.Fatal(err)
				}
				checkRendered(t, out, storeComp, scrape)
			})
		}
	}
}

// checkRendered checks one rendered overlay.
func checkRendered(t *testing.T, rendered []byte, storeComp, scrape string) {
	t.Helper()
	var podMonitors, annotated int
	var configs, secretEnv []string
	dec := yaml.NewDecoder(bytes.NewReader(rendered))
	for {
		var obj struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Template struct {
					Metadata struct {
						Annotations map[string]string `yaml:"annotations"`
					} `yaml:"metadata"`
					Spec struct {
						InitContainers []struct {
							Name string `yaml:"name"`
							Env  []struct {
								Name      string `yaml:"name"`
								ValueFrom struct {
									SecretKeyRef struct {
										Key string `yaml:"key"`
									} `yaml:"secretKeyRef"`
								} `yaml:"valueFrom"`
							} `yaml:"env"`
						} `yaml:"initContainers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("the rendered YAML: %v", err)
		}
		switch obj.Kind {
		case "PodMonitor":
			podMonitors++
		case "Deployment":
			for _, c := range obj.Spec.Template.Spec.InitContainers {
				for _, e := range c.Env {
					if c.Name == "idemproxy" && e.ValueFrom.SecretKeyRef.Key != "" {
						secretEnv = append(secretEnv, e.Name+"="+secretValues[e.ValueFrom.SecretKeyRef.Key])
					}
				}
			}
			for a := range obj.Spec.Template.Metadata.Annotations {
				if strings.HasPrefix(a, "prometheus.io/") {
					annotated++
				}
			}
		case "ConfigMap":
			if c, ok := obj.Data["config.yaml"]; ok {
				configs = append(configs, c)
			}
		}
	}
	if want := b2i(scrape == "components/podmonitor"); podMonitors != want {
		t.Errorf("PodMonitors = %d, want %d", podMonitors, want)
	}
	if want := 3 * b2i(scrape == "components/prometheus-annotations"); annotated != want {
		t.Errorf("prometheus.io annotations = %d, want %d", annotated, want)
	}
	if len(configs) != 1 {
		t.Fatalf("ConfigMaps with a config.yaml = %d, want 1", len(configs))
	}
	var cfg struct {
		Config struct {
			Watch bool `yaml:"watch"`
		} `yaml:"config"`
		Store map[string]any `yaml:"store"`
	}
	if err := yaml.Unmarshal([]byte(configs[0]), &cfg); err != nil {
		t.Fatalf("the rendered configuration: %v", err)
	}
	if !cfg.Config.Watch {
		t.Errorf("the rendered configuration has config.watch off: a ConfigMap update would not be applied")
	}
	if want := map[string]string{"": config.StoreBadger, "redis": config.StoreRedis, "postgres": config.StorePostgres}[storeComp]; cfg.Store[want] == nil {
		t.Errorf("store = %v, want %s", cfg.Store, want)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(configs[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "-config", path, "-check")
	// The variables the sidecar gets from its Secrets, as the pod has them.
	cmd.Env = append(cleanEnv(), secretEnv...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("-check of the rendered configuration: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), ": ok (") {
		t.Errorf("-check said:\n%s", out.String())
	}
}

// secretValues are stand-ins for the Secrets' values, by key, as the
// examples' comments create them.
var secretValues = map[string]string{
	"token":    "0123456789abcdef",
	"password": "redis-password",
	"dsn":      "postgres://idemproxy:secret@pg-rw.db.svc:5432/payments?sslmode=verify-full",
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
