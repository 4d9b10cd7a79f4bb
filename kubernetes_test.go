package mcpquota_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// kubernetesObjects decodes each document of examples/kubernetes.yaml
// strictly into the Kubernetes API type its kind names: a field the API
// does not have, or a value of the wrong type, is an error, as kubectl's
// server-side validation would make it.
func kubernetesObjects(t *testing.T) (*appsv1.Deployment, map[string]*corev1.Secret, map[string]*corev1.ConfigMap, *corev1.Service) {
	t.Helper()
	b, err := os.ReadFile("examples/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	var svc *corev1.Service
	secrets := map[string]*corev1.Secret{}
	configs := map[string]*corev1.ConfigMap{}
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			dep = &appsv1.Deployment{}
			obj = dep
		case "v1 Service":
			svc = &corev1.Service{}
			obj = svc
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		default:
			t.Fatalf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, head.Kind, err)
		}
		switch o := obj.(type) {
		case *corev1.Secret:
			secrets[o.Name] = o
		case *corev1.ConfigMap:
			configs[o.Name] = o
		}
	}
	if dep == nil || svc == nil {
		t.Fatal("want a Deployment and a Service")
	}
	return dep, secrets, configs, svc
}

// TestKubernetesManifest: the example Deployment probes the server, takes
// every secret from the Secret (none in the ConfigMap), runs unprivileged
// with a read-only root, keeps its state in PostgreSQL, and is reached
// through the Service.
func TestKubernetesManifest(t *testing.T) {
	dep, secrets, configs, svc := kubernetesObjects(t)
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("containers = %d; want 1", len(spec.Containers))
	}
	c := spec.Containers[0]

	if got := strings.Join(c.Args, " "); got != "serve --listen 0.0.0.0:8787 --drain-delay 10s" {
		t.Errorf("args = %q; want serve on 0.0.0.0:8787, draining 10 s", got)
	}
	// docs/operations.md: the drain lasts at least the readiness probe's
	// period times its failure threshold, so that the balancer has taken
	// the replica out before its listener closes; the grace period covers
	// the drain and the shutdown timeout (30 s by default).
	if p := c.ReadinessProbe; p != nil {
		drain := 5 * time.Second // serve's default off loopback
		if i := slices.Index(c.Args, "--drain-delay"); i >= 0 && i+1 < len(c.Args) {
			var err error
			if drain, err = time.ParseDuration(c.Args[i+1]); err != nil {
				t.Errorf("--drain-delay %q: %v", c.Args[i+1], err)
			}
		}
		if seen := time.Duration(p.PeriodSeconds*max(p.FailureThreshold, 1)) * time.Second; drain < seen {
			t.Errorf("--drain-delay %s; want at least the readiness probe's %s (period × failure threshold)", drain, seen)
		}
		if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < drain+30*time.Second {
			t.Errorf("terminationGracePeriodSeconds %v; want at least the drain and the shutdown timeout, %s", g, drain+30*time.Second)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8787 || c.Ports[0].Name != "http" {
		t.Errorf("ports = %+v; want http 8787", c.Ports)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "http" {
		t.Errorf("readinessProbe = %+v; want GET /readyz on http", p)
	}
	if p := c.LivenessProbe; p == nil || (p.TCPSocket == nil && p.HTTPGet == nil) {
		t.Errorf("livenessProbe = %+v; want one", p)
	}

	// Secrets: each env value from a key of the Secret that exists.
	secret := secrets["mcp-quota"]
	if secret == nil {
		t.Fatalf("no Secret mcp-quota (secrets %v)", secrets)
	}
	for _, e := range c.Env {
		if e.Value != "" {
			t.Errorf("env %s has a literal value; want it from the Secret", e.Name)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref == nil || ref.Name != secret.Name {
			t.Errorf("env %s does not come from Secret %s", e.Name, secret.Name)
			continue
		}
		if _, ok := secret.StringData[ref.Key]; !ok {
			t.Errorf("env %s names key %s, which Secret %s does not have", e.Name, ref.Key, secret.Name)
		}
	}
	config := configs["mcp-quota"]
	if config == nil {
		t.Fatal("no ConfigMap mcp-quota")
	}
	toml := config.Data["config.toml"]
	for name := range secret.StringData {
		env := false
		for _, e := range c.Env {
			env = env || e.Name == name
		}
		if !env {
			t.Errorf("Secret key %s reaches no container", name)
		}
		if name != "PGPASSWORD" && !strings.Contains(toml, `"`+name+`"`) {
			t.Errorf("Secret key %s is named by no secret_env or token_env of config.toml", name)
		}
	}
	if !strings.Contains(toml, "[[callers]]") {
		t.Error("config.toml has no [[callers]]: serve refuses 0.0.0.0 without them")
	}
	if !strings.Contains(toml, `state = "postgres://`) || strings.Contains(toml, "password") {
		t.Error(`config.toml: want state = "postgres://…" without a password (it comes from PGPASSWORD)`)
	}

	// Unprivileged, read-only root, the state directory and /tmp writable.
	ps := spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 {
		t.Errorf("pod securityContext = %+v; want runAsNonRoot, runAsUser 65532", ps)
	}
	cs := c.SecurityContext
	if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
		cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
		cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container securityContext = %+v; want a read-only root, no privilege escalation, all capabilities dropped", cs)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = !m.ReadOnly
	}
	for path, writable := range map[string]bool{"/etc/mcp-quota": false, "/var/lib/mcp-quota": true, "/tmp": true} {
		if w, ok := mounts[path]; !ok || w != writable {
			t.Errorf("mount %s: present %v, writable %v; want present, writable %v", path, ok, w, writable)
		}
	}

	// The Service selects the Deployment's pods.
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, which the pods do not carry", k, v)
		}
	}
}
