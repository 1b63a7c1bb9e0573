package config

// PathEnv names the environment variable that gives the configuration
// path when -config is not given.
const PathEnv = "IDEMPROXY_CONFIG"

// PathOf returns the configuration path, from -config, else from
// IDEMPROXY_CONFIG, else ./config.yaml, and says where it came from.
func PathOf(flagValue string, getenv func(string) string) (path, from string) {
	switch {
	case flagValue != "":
		return flagValue, "-config"
	case getenv(PathEnv) != "":
		return getenv(PathEnv), "$" + PathEnv
	}
	return "config.yaml", "the default, ./config.yaml (neither -config nor $" + PathEnv + " is set)"
}
