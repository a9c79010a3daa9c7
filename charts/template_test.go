package charts

import (
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/release"
)

// TestChartRendersOfflineAsHelmTemplateDoes renders the chart the way `helm
// template` does, and GitOps tools that render before they apply: an
// install in client-only dry-run mode, with no cluster and no
// --kube-version. Helm then checks the chart's kubeVersion against its own
// default Kubernetes version, which depends on the Helm build (v1.20.0 in
// this test binary) and not on any cluster.
func TestChartRendersOfflineAsHelmTemplateDoes(t *testing.T) {
	chrt, err := loader.Load(chartDir())
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = "netplane"
	install.Namespace = namespace
	install.Replace = true // as helm template: no release name check
	rel, err := install.Run(chrt, nil)
	if err != nil {
		t.Fatalf("helm template with Helm's default Kubernetes %s: %v", common.DefaultCapabilities.KubeVersion.Version, err)
	}
	acc, err := release.NewAccessor(rel)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(acc.Manifest())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct{ kind, name string }{
		{"Deployment", "netplane-controller"}, {"Deployment", "netplane-dns"}, {"DaemonSet", "netplane-node"}, {"Service", "kube-dns"},
	} {
		find(t, objs, want.kind, want.name)
	}
}
