{{/* The signer's image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "podcert.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The example pair's image reference. */}}
{{- define "podcert.examplesImage" -}}
{{ .Values.examples.image.repository }}:{{ .Values.examples.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* imagePullPolicy, only when set (else the cluster's default, as the kustomize bases). */}}
{{- define "podcert.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The signer names as a CEL list literal: ['a/b', 'c/d']. */}}
{{- define "podcert.signerNamesCEL" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
[{{- range $i, $name := .Values.signerNames }}{{ if $i }}, {{ end }}'{{ $name }}'{{ end }}]
{{- end }}

{{/* The first signer name: the one the example pair's volumes ask. */}}
{{- define "podcert.firstSigner" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
{{ first .Values.signerNames }}
{{- end }}

{{/* The signer name of federated trust domains' ClusterTrustBundles: federation.signerName, else
<the first served signer's domain>/federated, as the signer itself defaults it. */}}
{{- define "podcert.federatedSigner" -}}
{{- if .Values.federation.signerName }}{{ .Values.federation.signerName }}
{{- else }}{{ include "podcert.firstSigner" . | splitList "/" | first }}/federated{{ end }}
{{- end }}

{{/* The names whose ClusterTrustBundles the signer may write, as a CEL list literal: the served
signer names, then the federation's. */}}
{{- define "podcert.trustBundleSignersCEL" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
[{{- range .Values.signerNames }}'{{ . }}', {{ end }}'{{ include "podcert.federatedSigner" . }}']
{{- end }}
