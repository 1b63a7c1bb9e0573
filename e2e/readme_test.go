package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The pages the tests below keep in step with the binary.
const (
	operationsDoc    = "docs/operations.md"
	configurationDoc = "docs/configuration.md"
	httpAPIDoc       = "docs/http-api.md"
	tutorialDoc      = "docs/tutorial.md"
)

// TestDeployConfigsCheck: every configuration under deploy/, the ones in
// the Kubernetes ConfigMaps included, passes -check.
func TestDeployConfigsCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := []string{"config.example.yaml", "deploy/compose-config.yaml", "deploy/container-config.yaml"}
	for _, f := range []string{"deploy/kubernetes/configmap.yaml", "deploy/kubernetes/redis/redis-store.patch.yaml",
		"deploy/kubernetes/postgres/postgres-store.patch.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var cm struct {
				Kind string            `yaml:"kind"`
				Data map[string]string `yaml:"data"`
			}
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if c, ok := cm.Data["config.yaml"]; ok && cm.Kind == "ConfigMap" {
				out := filepath.Join(dir, strings.ReplaceAll(f, "/", "_"))
				os.WriteFile(out, []byte(c), 0o600)
				files = append(files, out)
				found = true
			}
		}
		if !found {
			t.Errorf("%s holds no ConfigMap with a config.yaml", f)
		}
	}
	for _, f := range files {
		cmd := exec.Command(bin, "-check", "-config", f)
		cmd.Env = append(os.Environ(), "IDEMPROXY_REDIS_PASSWORD=set-from-a-secret",
			"IDEMPROXY_POSTGRES_DSN=postgres://idemproxy:set-from-a-secret@pg:5432/payments")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", f, err, out)
		}
	}
}
