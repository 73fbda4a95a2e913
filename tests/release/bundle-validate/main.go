// nmo-bundle-validate runs the Operator Framework's bundle validators
// (github.com/operator-framework/api/pkg/validation) on a bundle directory and,
// unlike `operator-verify manifests`, exits non-zero when any of them reports
// an error. It runs the default bundle validators (CSV, CRD, bundle) plus the
// optional ones operator-verify does not expose: OperatorHub v2, standard
// capabilities and categories, bundle objects (PDBs), good practices and the
// removed-API check for the given Kubernetes version.
//
// Usage: nmo-bundle-validate [-k8s-version 1.33] [-strict] <bundle-dir>
// Built by tests/release/tools.sh; run by tests/release/check-bundle.sh.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	k8sVersion := flag.String("k8s-version", "", "Kubernetes version the bundle must install on (removed-API check)")
	strict := flag.Bool("strict", false, "treat warnings as errors")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: nmo-bundle-validate [-k8s-version X.Y] [-strict] <bundle-dir>")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	// GetBundleFromDir wants the manifests/ directory's parent or the directory
	// itself; accept both.
	if st, err := os.Stat(filepath.Join(dir, "manifests")); err == nil && st.IsDir() {
		dir = filepath.Join(dir, "manifests")
	}
	bundle, err := manifests.GetBundleFromDir(filepath.Dir(dir))
	if err != nil || bundle == nil {
		fmt.Fprintf(os.Stderr, "ERROR: cannot load the bundle in %s: %v\n", filepath.Dir(dir), err)
		os.Exit(1)
	}

	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.ObjectValidator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
	)
	objs := bundle.ObjectsToValidate()
	if *k8sVersion != "" {
		objs = append(objs, map[string]string{"k8s-version": *k8sVersion})
	}
	results := validators.Validate(objs...)

	nErr, nWarn := 0, 0
	for _, r := range results {
		for _, e := range r.Errors {
			nErr++
			fmt.Printf("ERROR   %s: %s\n", r.Name, describe(e))
		}
		for _, w := range r.Warnings {
			nWarn++
			fmt.Printf("WARNING %s: %s\n", r.Name, describe(w))
		}
	}
	fmt.Printf("bundle %s (%s): %d validator result sets, %d errors, %d warnings\n",
		bundle.Name, filepath.Dir(dir), len(results), nErr, nWarn)
	if nErr > 0 || (*strict && nWarn > 0) {
		os.Exit(1)
	}
}

func describe(e errors.Error) string {
	return e.Error()
}
