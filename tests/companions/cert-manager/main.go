// cert-manager-local runs cert-manager's own controllers against the local
// control plane, as two processes like a real install: `controller` (issuers,
// the certificates-* loops, certificate requests for the self-signed and CA
// issuers, the approver) and `cainjector` (caBundle injection into webhook
// configurations).
//
// Why a main of ours: cert-manager's current release serves its controllers
// as packages of the root module (pkg/controller/...), but its cmd/* mains
// are separate modules the Go module proxy does not serve. This file is only
// the wiring cert-manager's own mains do (options, informer start, a
// controller-runtime manager for cainjector); every loop that issues,
// renews, approves and injects is cert-manager's code, unchanged. ACME,
// Vault, Venafi and the ingress/gateway shims are left out: nmo-rs uses
// self-signed and CA issuers only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	// Each of these registers its loop with controllerpkg in init().
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The issuer implementations the issuers loops set up.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s controller|cainjector --kubeconfig FILE [--cluster-resource-namespace NS] [--feature-gates GATES]\n", os.Args[0])
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server")
	resourceNS := fs.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuer secrets")
	gates := fs.String("feature-gates", "", "cert-manager feature gates, as its own mains take them (e.g. CAInjectorMerging=false: cainjector as before v1.16, replacing the caBundle instead of merging)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		usage()
	}
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fmt.Fprintf(os.Stderr, "cert-manager-local: --feature-gates=%s: %v\n", *gates, err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "controller":
		err = runController(ctx, *kubeconfig, *resourceNS)
	case "cainjector":
		err = runCAInjector(ctx, *kubeconfig)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-local %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// runController starts every registered loop, then the informers they asked
// for, and waits for them all (cert-manager's controller main does the same,
// behind leader election, which one local process does not need).
func runController(ctx context.Context, kubeconfig, resourceNS string) error {
	logger := zap.New(zap.UseDevMode(false))
	ctx = logf.NewContext(ctx, logger, "controller")
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: resourceNS},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	names := make([]string, 0, len(controllerpkg.Known()))
	for name := range controllerpkg.Known() {
		names = append(names, name)
	}
	sort.Strings(names)
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for _, name := range names {
		loop, err := controllerpkg.Known()[name](factory)
		if err != nil {
			return fmt.Errorf("constructing %s: %w", name, err)
		}
		wg.Add(1)
		go func(name string, loop controllerpkg.Interface) {
			defer wg.Done()
			logger.Info("starting controller", "controller", name)
			if err := loop.Run(5, ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}(name, loop)
	}
	// Every Context built from the factory shares its informer factories.
	shared, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the shared context: %w", err)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
}

// runCAInjector is cainjector: a controller-runtime manager with cert-manager's
// injectors for webhook configurations (APIService and CRD injection are off:
// the local plane has no aggregated API or conversion webhook of ours).
func runCAInjector(ctx context.Context, kubeconfig string) error {
	ctrl.SetLogger(zap.New(zap.UseDevMode(false)))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading kubeconfig %q: %w", kubeconfig, err)
	}
	// cainjector's server-side apply takes its field manager from the user agent.
	cfg = util.RestConfigWithUserAgent(cfg, "cainjector")
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, cmscheme.AddToScheme, admissionv1.AddToScheme,
		apiextv1.AddToScheme, apiregv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return fmt.Errorf("building the scheme: %w", err)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Secrets are watched as metadata only (as cainjector does) and read
		// from the API server when a CA is injected.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.MutatingWebhookConfigurationName:   true,
		},
	})
	if err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	return mgr.Start(ctx)
}
