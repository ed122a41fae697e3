"""Admission: the signer's checks before a request is stored, and the webhook that serves them.

`review` (pure: the verdict on an AdmissionReview), `cabundle` (pure: the caBundle the webhook's
registration must carry); `webhook` serves the reviews and `cainjector` keeps the registration's
caBundle equal to `cabundle`'s answer.
"""
